"""A real one-host Slurm cluster for tests: its own munged, one slurmctld and two slurmd
(nodes ``n1`` and ``n2``), all under one folder, on ports free when it starts.

Nothing reads or changes /etc/slurm: client commands find this cluster through
``SlurmCluster.env`` (``SLURM_CONF``), which callers merge into their environment.
Needs Debian's ``slurm-wlm`` and ``munge`` and root (slurmd runs jobs as their owner).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from itertools import count
from pathlib import Path
from types import TracebackType

NEEDED = ("slurmctld", "slurmd", "sbatch", "munged")
START_TIMEOUT_S = 30.0
JOBS_END_TIMEOUT_S = 20.0  # scancel's SIGTERM, then SIGKILL after KillWait (5 s)
TERM_GRACE_S = 5.0
POLL_S = 0.1
CLIENT_TIMEOUT_S = 30.0
LOG_TAIL_LINES = 25
# munged's key when the host has none: any 128 bytes both ends share will do.
KEY_BYTES = 128

_instances = count(1)


class SlurmCluster:
    """munged + slurmctld + slurmd ``n1`` and ``n2``, started and stopped as one."""

    node_names = ["n1", "n2"]

    def __init__(self, root: Path, *, cpus: int | None = None) -> None:
        self.root = root
        self.cpus = cpus or os.cpu_count() or 1
        # lower case and short: Slurm lower-cases cluster names; unique per process
        # and instance, so xdist workers' clusters (and their leftovers) never mix
        self.name = f"ty{os.getpid()}x{next(_instances)}"
        self.conf = root / "slurm.conf"
        self.logs = root / "log"
        self.munge_socket = root / "munge" / "socket"
        self.env = {"SLURM_CONF": str(self.conf)}
        self._daemons: dict[str, subprocess.Popen[bytes]] = {}

    @staticmethod
    def available() -> str | None:
        """Why a cluster cannot start here (a reason to skip), or None."""
        missing = [name for name in NEEDED if shutil.which(name) is None]
        for sbin in ("/usr/sbin", "/sbin"):  # daemons are in sbin, often not on a test PATH
            missing = [name for name in missing if not (Path(sbin) / name).exists()]
        if missing:
            return f"Slurm test cluster needs {', '.join(missing)} (apt-get slurm-wlm munge)"
        if os.geteuid() != 0:
            return "Slurm test cluster needs root (slurmd runs jobs as their submitter)"
        return None

    # -- lifecycle ------------------------------------------------------------------

    def __enter__(self) -> SlurmCluster:
        self.start()
        return self

    def __exit__(
        self, _t: type[BaseException] | None, _e: BaseException | None, _tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Write the config, start the daemons, and wait until both nodes are idle."""
        try:
            for folder in [self.logs, self.root / "state"]:
                folder.mkdir(parents=True, exist_ok=True)
            for node in self.node_names:
                (self.root / "spool" / node).mkdir(parents=True, exist_ok=True)
            self._start_munged()
            ctld_port, *node_ports = free_ports(1 + len(self.node_names))
            self.conf.write_text(self._slurm_conf(ctld_port, node_ports))
            self._spawn("slurmctld", ["-D", "-i", "-f", str(self.conf)])
            for node in self.node_names:
                self._spawn(f"slurmd.{node}", ["-D", "-f", str(self.conf), "-N", node])
            self._wait_idle()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Cancel every job, stop the daemons, and kill whatever of the cluster is left."""
        if "slurmctld" in self._daemons and self._daemons["slurmctld"].poll() is None:
            # a controller that does not answer must not keep the daemons alive
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                self._drain()
        # slurmd first, so none of them waits on a controller that is already gone
        order = {"slurmctld": 1, "munged": 2}  # munged last: the others talk to it
        for name in sorted(self._daemons, key=lambda n: order.get(n, 0)):
            _end(self._daemons[name])
        self._daemons.clear()
        # slurmstepd and job processes are reparented away from the daemons: find them
        # by the cluster name slurmd and every job carry in their environment
        for pid in self.processes():
            _kill(pid, signal.SIGKILL)

    # -- client commands ------------------------------------------------------------

    def run(
        self, *argv: str, timeout: float = CLIENT_TIMEOUT_S
    ) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command (``sbatch``, ``squeue``, ...) against this cluster."""
        return subprocess.run(
            argv,
            env={**os.environ, **self.env},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def squeue_ids(self) -> list[str]:
        """Ids of the jobs the controller still lists (pending, running or completing)."""
        out = self.run("squeue", "-h", "-o", "%i")
        if out.returncode != 0:
            raise RuntimeError(f"squeue failed: {out.stderr.strip()}")
        return out.stdout.split()

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job -o``'s fields (JobState, Reason, ExitCode, ...); {} if unknown."""
        out = self.run("scontrol", "show", "job", "-o", job_id)
        if out.returncode != 0:
            return {}
        fields: dict[str, str] = {}
        for word in out.stdout.split():  # values with spaces (Command=) come out cut short
            key, sep, value = word.partition("=")
            if sep:
                fields.setdefault(key, value)
        return fields

    def wait_state(self, job_id: str, *states: str, timeout: float = 30.0) -> dict[str, str]:
        """Wait until the job's JobState is one of ``states``; its fields then."""
        deadline = time.monotonic() + timeout
        while (fields := self.job(job_id)).get("JobState") not in states:
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} not {'/'.join(states)} in {timeout} s: {fields}")
            time.sleep(POLL_S)
        return fields

    def set_partition_state(self, state: str) -> None:
        """Set the ``debug`` partition UP, DOWN, DRAIN or INACTIVE."""
        out = self.run("scontrol", "update", "PartitionName=debug", f"State={state}")
        if out.returncode != 0:
            raise RuntimeError(f"scontrol update partition failed: {out.stderr.strip()}")

    def processes(self) -> list[int]:
        """Pids of every process of this cluster: daemons, slurmstepd, jobs' tasks."""
        marker = f"SLURM_CLUSTER_NAME={self.name}".encode()
        return [pid for pid in _pids() if marker in _environ(pid)]

    def job_processes(self, job_id: str) -> list[int]:
        """Pids of one job's processes (its tasks and their slurmstepd) on any node."""
        mine = set(self.processes())
        marker = f"SLURM_JOB_ID={job_id}".encode()
        step = f"slurmstepd: [{job_id}.".encode()
        return [pid for pid in mine if marker in _environ(pid) or _cmdline(pid).startswith(step)]

    # -- internals ------------------------------------------------------------------

    def _drain(self) -> None:
        ids = self.squeue_ids()
        if ids:
            self.run("scancel", *ids)
        deadline = time.monotonic() + JOBS_END_TIMEOUT_S
        while self.squeue_ids() and time.monotonic() < deadline:
            time.sleep(POLL_S)
        # a cancelled job leaves squeue before its slurmstepd has reaped its tasks
        while self._steps() and time.monotonic() < deadline:
            time.sleep(POLL_S)

    def _steps(self) -> list[int]:
        return [pid for pid in self.processes() if _cmdline(pid).startswith(b"slurmstepd")]

    def _start_munged(self) -> None:
        folder = self.munge_socket.parent
        folder.mkdir()
        # munged checks its folders: none writable by others, the socket's searchable
        folder.chmod(0o711)
        key = folder / "munge.key"
        host_key = Path("/etc/munge/munge.key")
        if host_key.exists():
            shutil.copyfile(host_key, key)
        else:
            key.write_bytes(os.urandom(KEY_BYTES))
        key.chmod(0o600)
        self._spawn(
            "munged",
            [
                "--foreground",
                "--force",
                f"--socket={self.munge_socket}",
                f"--key-file={key}",
                f"--pid-file={folder / 'munged.pid'}",
                f"--log-file={self.logs / 'munged.log'}",
                f"--seed-file={folder / 'munged.seed'}",
            ],
        )
        self._wait(lambda: self.munge_socket.exists(), "munged's socket")

    def _spawn(self, name: str, args: list[str]) -> None:
        program = name.split(".")[0]
        path = shutil.which(program) or f"/usr/sbin/{program}"
        # the marker is how stop() finds slurmstepd, which inherits slurmd's environment
        env = {**os.environ, **self.env, "SLURM_CLUSTER_NAME": self.name}
        with open(self.logs / f"{name}.out", "wb") as out:
            self._daemons[name] = subprocess.Popen(
                [path, *args],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C in pytest does not reach the daemons
            )

    def _wait_idle(self) -> None:
        def idle() -> bool:
            for name, daemon in self._daemons.items():
                if daemon.poll() is not None:
                    raise RuntimeError(f"{name} exited ({daemon.returncode})\n{self._log_tails()}")
            out = self.run("sinfo", "-h", "-N", "-o", "%N %T")
            states = dict(line.split() for line in out.stdout.splitlines() if line.strip())
            return out.returncode == 0 and all(states.get(n) == "idle" for n in self.node_names)

        self._wait(idle, "both nodes idle")

    def _wait(self, condition: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not condition():
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"Slurm test cluster: no {what} in {START_TIMEOUT_S:.0f} s\n{self._log_tails()}"
                )
            time.sleep(POLL_S)

    def _log_tails(self) -> str:
        tails = []
        for log in sorted(self.logs.glob("*")):
            if log.suffix == ".out" and log.with_suffix(".log").exists():
                continue  # a daemon's own log has all its stderr has, and more
            lines = log.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
            tails.append(f"--- {log.name}\n" + "\n".join(lines))
        return "\n".join(tails)

    def _slurm_conf(self, ctld_port: int, node_ports: list[int]) -> str:
        host = socket.gethostname()
        r = self.root
        nodes = "\n".join(
            f"NodeName={node} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} "
            f"CPUs={self.cpus} State=UNKNOWN"
            for node, port in zip(self.node_names, node_ports, strict=True)
        )
        return f"""\
ClusterName={self.name}
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.munge_socket}
StateSaveLocation={r / "state"}
SlurmdSpoolDir={r / "spool" / "%n"}
SlurmctldPidFile={r / "slurmctld.pid"}
SlurmdPidFile={r / "slurmd.%n.pid"}
SlurmctldLogFile={self.logs / "slurmctld.log"}
SlurmdLogFile={self.logs / "slurmd.%n.log"}
SlurmctldDebug=info
SlurmdDebug=info
# no cgroups in containers: track and bind nothing
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
# schedule on every submit and at least every second: jobs start within about 1 s
SchedulerParameters=sched_interval=1,sched_min_interval=100000,bf_interval=1
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
ReturnToService=2
# finished jobs stay visible to `scontrol show job` for 5 minutes
MinJobAge=300
KillWait=5
JobRequeue=1
InactiveLimit=0
SlurmctldTimeout=30
SlurmdTimeout=30
{nodes}
# FORCE: up to 4 jobs share a CPU, so a 2-core box runs several one-CPU jobs per node
PartitionName=debug Nodes={",".join(self.node_names)} Default=YES MaxTime=INFINITE \
State=UP OverSubscribe=FORCE
"""


def free_ports(n: int) -> list[int]:
    """n TCP ports free on every address right now (held together, so all distinct)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _end(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL after a grace period; always reaped."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(TERM_GRACE_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    # slurmctld's slurmscriptd helper shares its session: take anything left in it
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)


def _kill(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def _pids() -> Iterator[int]:
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            yield int(entry)


def _environ(pid: int) -> list[bytes]:
    """The process's environment as ``NAME=value`` entries ([] if it is gone)."""
    try:
        return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return []


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""
