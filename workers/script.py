"""A script job's attempt: the user's own entrypoint, run in its unpacked package.

``single`` and ``dp`` run the entrypoint as one process that sees the job's devices, with
``MASTER_ADDR``/``MASTER_PORT`` free on loopback, so a script that calls ``mp.spawn`` and
``init_process_group`` itself runs as it is. ``ddp`` starts it once per device through
PyTorch's own launcher (the elastic launch API that ``torchrun`` runs, c10d rendezvous
on loopback): a script that runs under ``torchrun`` runs here unchanged.

The script's environment is an allow-list (no database URL, no API token) plus the
job's own variables (``job_env``). The runner follows ``$TRAINYARD_METRICS_FILE`` into
the database, keeps the tail of the script's stderr for the job's ``error``, and turns
how the script ended into the attempt's ``RunnerReport``.

SIGTERM means "checkpoint now and exit": the supervisor sends it to the attempt's whole
process group (for ddp the launch passes it on to the ranks); a script that exits
within the grace period after it goes back to the queue without spending an attempt.
"""

from __future__ import annotations

import io
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from service.jobspec import resolve_strategy
from service.models import Job, Strategy
from service.reasons import ReasonCode
from service.settings import Settings
from service.store import Fence
from workers.blob_cache import BlobCache
from workers.jobfiles import JobFiles
from workers.metrics_file import MetricsFile
from workers.outcome import RunnerReport, how_it_ended
from workers.reporter import DbReports
from workers.venvs import python_for, requirement_lines

log = logging.getLogger(__name__)

# Variables a script inherits from the worker's environment; nothing else (the database
# URL and the API token above all) reaches it.
INHERITED = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TERM")
INHERITED_PREFIXES = ("LC_", "NCCL_", "GLOO_", "CUDA_", "NVIDIA_", "PIP_", "HF_", "TORCH_")
LOOPBACK = "127.0.0.1"
STDERR_TAIL_LINES = 30
METRICS_POLL_S = 0.5
JOB_PATH = Path(__file__).with_name("job_path")  # trainyard_job, on the script's PYTHONPATH
DIE_WITH_PARENT = Path(__file__).with_name("die_with_parent.py")
PYTHON_NAMES = ("python", "python3", f"python3.{sys.version_info.minor}")


def _raw(fd: int) -> BinaryIO:
    """This process's own stdout (1) or stderr (2): the job's log, under the "[runner] "
    prefixing of sys.stdout and sys.stderr."""
    return open(fd, "wb", closefd=False)  # noqa: SIM115 (lives as long as the process)


@dataclass(frozen=True)
class Script:
    """What the attempt runs, where, and with which environment."""

    argv: list[str]
    cwd: Path
    env: dict[str, str]
    metrics: Path
    ranks: int | None = None  # ddp: argv once per device, through the elastic launch
    run_id: str = ""  # ddp: the rendezvous' run id, one per attempt
    logs: Path | None = None  # ddp: where the launch keeps each rank's output


def prepare(
    settings: Settings, job: Job, attempt: int, *, accelerator: str, threads: int
) -> Script:
    """Fetch and unpack the package, place the data, build the requirements' virtualenv."""
    assert job.id is not None and job.code is not None and job.entrypoint is not None
    files = JobFiles.of(settings.data_dir, job.id)
    cache = BlobCache(settings)
    package = cache.code(job.code)
    place_inputs(cache, job.data or {}, files.inputs)
    for folder in (files.output, files.checkpoints):
        folder.mkdir(parents=True, exist_ok=True)
    metrics = files.metrics_file(attempt)
    metrics.parent.mkdir(parents=True, exist_ok=True)
    metrics.touch(mode=0o600)  # the script appends; the runner follows
    python = python_for(
        requirement_lines(job.requirements, package),
        cache.root,
        package,
        timeout_s=settings.requirements_timeout_s,
    )
    env = job_env(job, attempt, files, accelerator=accelerator, threads=threads, python=python)
    program, *args = job.entrypoint
    argv = [python if program in PYTHON_NAMES else program, *args]
    if resolve_strategy(job.strategy, job.devices) != Strategy.ddp:
        return Script(argv, package, env, metrics)
    return Script(
        argv,
        package,
        env,
        metrics,
        ranks=job.devices,
        run_id=f"trainyard-job-{job.id}-attempt-{attempt}",
        logs=files.torchrun_logs,
    )


def job_env(
    job: Job, attempt: int, files: JobFiles, *, accelerator: str, threads: int, python: str
) -> dict[str, str]:
    """The script's environment: the allow-list, then the job's own variables."""
    assert job.id is not None
    env = {
        k: v for k, v in os.environ.items() if k in INHERITED or k.startswith(INHERITED_PREFIXES)
    }
    bin_dir = str(Path(python).parent)
    env.update(
        PATH=f"{bin_dir}:{env.get('PATH', '/usr/bin:/bin')}",
        PYTHONPATH=str(JOB_PATH),
        PYTHONUNBUFFERED="1",  # lines reach the job's log as they are printed
        OMP_NUM_THREADS=str(threads),
        MASTER_ADDR=LOOPBACK,
        MASTER_PORT=str(free_port()),
        TRAINYARD_JOB_ID=str(job.id),
        TRAINYARD_ATTEMPT=str(attempt),
        TRAINYARD_DEVICES=str(job.devices),
        TRAINYARD_ACCELERATOR=accelerator,
        TRAINYARD_OUTPUT_DIR=str(files.output),
        TRAINYARD_CHECKPOINT_DIR=str(files.checkpoints),
        TRAINYARD_INPUT_DIR=str(files.inputs),
        TRAINYARD_METRICS_FILE=str(files.metrics_file(attempt)),
    )
    if accelerator == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""  # a CPU job must not find the box's GPUs
    return env


@dataclass(frozen=True)
class Ended:
    """How the script's process (or its ranks) ended."""

    how: str  # "exited with 1", "killed by SIGKILL"
    ok: bool
    tail: list[str]  # the last lines of its stderr
    cannot_start: bool = False  # no such program: the entrypoint is wrong


def run(settings: Settings, fence: Fence, script: Script) -> RunnerReport:
    """Run the script to its end, following its metrics; how it ended, as a report."""
    terminated = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: terminated.set())
    log.info("running %s in %s", " ".join(script.argv), script.cwd)
    with DbReports(settings, fence).open() as reporter:
        metrics = MetricsFile(script.metrics, reporter)
        done = threading.Event()
        follower = threading.Thread(
            target=_follow, args=(metrics, done), name="metrics-file", daemon=True
        )
        follower.start()
        try:
            ranks = script.ranks is not None
            ended = _run_ranks(script, terminated) if ranks else _run_process(script)
        finally:
            done.set()
            follower.join()
        metrics.poll()  # what it wrote last
    if ended.cannot_start:
        return _failed(ended.how, [], retryable=False)
    if terminated.is_set():
        return RunnerReport(ok=False, preempted=f"the script {ended.how} after SIGTERM")
    if ended.ok:
        return RunnerReport(ok=True, result=metrics.final())
    return _failed(f"the script {ended.how}", ended.tail, retryable=True)


def _run_process(script: Script) -> Ended:
    """single and dp: the entrypoint as one process in this attempt's process group."""
    tail = _Tail(_raw(2))
    try:
        proc = subprocess.Popen(
            script.argv,
            cwd=script.cwd,
            env=script.env,
            stdin=subprocess.DEVNULL,
            stderr=subprocess.PIPE,  # copied to ours, its tail kept for the error
        )
    except OSError as exc:
        return Ended(f"cannot start {script.argv[0]!r}: {exc}", False, [], cannot_start=True)
    assert proc.stderr is not None
    for line in iter(proc.stderr.readline, b""):
        tail.write(line.decode(errors="replace"))
    proc.stderr.close()
    returncode = proc.wait()
    return Ended(how_it_ended(returncode), returncode == 0, tail.lines())


def _run_ranks(script: Script, terminated: threading.Event) -> Ended:
    """ddp: the entrypoint once per device, started by PyTorch's elastic launch (the API
    torchrun runs), here in the runner: torch is imported already, so the ranks start
    about a second sooner than under a torchrun of their own. c10d rendezvous on
    loopback, no restarts (a failed attempt is the supervisor's to retry), every rank's
    output teed into the log behind "[rank N] ".

    The agent gives the ranks this process's environment plus torchrun's variables, so
    for the launch it is the script's own (no database URL, no token). It starts each
    rank in a session of its own, so each goes through die_with_parent: should this
    process be killed outright, its ranks die with it. SIGTERM reaches the agent (its own
    handler), which passes it to the ranks and waits for them."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    assert script.ranks is not None and script.logs is not None
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=script.ranks,
        run_id=script.run_id,
        rdzv_backend="c10d",
        rdzv_endpoint=f"{LOOPBACK}:{free_port()}",
        local_addr=LOOPBACK,
        max_restarts=0,
        logs_specs=DefaultLogsSpecs(log_dir=str(script.logs), tee=Std.ALL),
        log_line_prefix_template="[rank ${rank}] ",
    )
    tail = _Tail(_raw(2))
    saved = (sys.stdout, sys.stderr, dict(os.environ), os.getcwd())
    # the agent copies its output to sys.stdout/sys.stderr: ours, not the "[runner] " ones
    sys.stdout, sys.stderr = io.TextIOWrapper(_raw(1), line_buffering=True), tail
    os.environ.clear()
    os.environ.update(script.env)
    os.chdir(script.cwd)
    logging.getLogger("torch.distributed.elastic").setLevel(logging.WARNING)
    try:
        elastic_launch(config, entrypoint=sys.executable)("-I", str(DIE_WITH_PARENT), *script.argv)
        return Ended("exited with 0", True, tail.lines())
    except SignalException as stop:  # the agent stopped the ranks and waited for them
        terminated.set()
        return Ended(f"was stopped ({stop.sigval.name})", False, tail.lines())
    except ChildFailedError as failed:
        rank, failure = failed.get_first_failure()
        how = f"rank {rank} {how_it_ended(failure.exitcode)}"
        return Ended(how, False, tail.lines())
    finally:
        sys.stdout, sys.stderr = saved[0], saved[1]
        os.environ.clear()
        os.environ.update(saved[2])
        os.chdir(saved[3])


class _Tail(io.TextIOBase):
    """A text stream that writes to a binary one and keeps the last lines written."""

    def __init__(self, target: BinaryIO) -> None:
        self.target = target
        self.kept: deque[str] = deque(maxlen=STDERR_TAIL_LINES)
        self.pending = ""
        self.lock = threading.Lock()  # the agent's tail threads write at once

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        with self.lock:
            self.target.write(s.encode(errors="replace"))
            self.target.flush()
            *lines, self.pending = (self.pending + s).split("\n")
            self.kept.extend(lines)
        return len(s)

    def lines(self) -> list[str]:
        with self.lock:
            return [*self.kept, self.pending] if self.pending else list(self.kept)


def _follow(metrics: MetricsFile, done: threading.Event) -> None:
    while not done.wait(METRICS_POLL_S):
        metrics.poll()


def _failed(message: str, tail: list[str], *, retryable: bool) -> RunnerReport:
    return RunnerReport(
        ok=False,
        error={
            "type": "ScriptFailed",
            "message": message,
            "traceback": tail,
            "rank": None,
            "code": ReasonCode.error,
            "retryable": retryable,
        },
    )


def place_inputs(cache: BlobCache, data: dict[str, str], folder: Path) -> None:
    """Each data file at ``folder/<name>``: a link to the read-only cached blob."""
    folder.mkdir(parents=True, exist_ok=True)
    for entry in folder.iterdir():  # what an earlier attempt placed
        entry.unlink()
    for name, digest in data.items():
        (folder / name).symlink_to(cache.blob(digest))


def free_port() -> int:
    """A TCP port free on loopback now (the kernel's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])
