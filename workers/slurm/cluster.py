"""Slurm's own commands, and what they say: the one module that runs sbatch, squeue,
scontrol and scancel. Each is a short-lived process on the submit host; a worker asks
squeue about all of its jobs at once, once per poll."""

from __future__ import annotations

import logging
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

# A Slurm command that takes longer than this is a controller in trouble: the worker
# tries again at its next poll rather than hang its loop.
COMMAND_TIMEOUT_S = 30.0

# Slurm's job states (squeue %T), by what they mean to Trainyard.
WAITING = frozenset({"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"})
RUNNING = frozenset({"RUNNING", "COMPLETING", "SUSPENDED", "STOPPED", "SIGNALING",
                     "STAGE_OUT", "RESIZING", "RESV_DEL_HOLD"})  # fmt: skip
# Running, but paused by Slurm (PreemptMode=SUSPEND, scontrol suspend): its clocks stop.
PAUSED = frozenset({"SUSPENDED", "STOPPED"})
# Everything else is an end: COMPLETED, FAILED, CANCELLED, TIMEOUT, NODE_FAIL, PREEMPTED,
# OUT_OF_MEMORY, BOOT_FAIL, DEADLINE, SPECIAL_EXIT, REVOKED.


class SlurmError(RuntimeError):
    """A Slurm command failed; the message has what it printed."""


@dataclass(frozen=True)
class SlurmJob:
    """One line of squeue: a job as Slurm sees it now."""

    id: str
    state: str
    reason: str  # why it waits ("Priority", "Resources" ...); "None" when it does not
    nodes: str  # the nodes it runs on (a hostlist), "" while it waits
    used_s: float  # how long Slurm has run it
    comment: str

    @property
    def waiting(self) -> bool:
        return self.state in WAITING

    @property
    def running(self) -> bool:
        return self.state in RUNNING

    @property
    def paused(self) -> bool:
        return self.state in PAUSED

    @property
    def ended(self) -> bool:
        return not self.waiting and not self.running


class Cluster:
    """The cluster, through its commands, with the environment given (SLURM_CONF ...)."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        self.env = dict(os.environ if env is None else env)

    def _run(self, *argv: str, env: dict[str, str] | None = None) -> str:
        try:
            done = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                env=self.env if env is None else env,
                timeout=COMMAND_TIMEOUT_S,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SlurmError(f"{argv[0]}: {exc}") from exc
        if done.returncode != 0:
            said = (done.stderr or done.stdout).strip().splitlines()
            raise SlurmError(f"{argv[0]} exited with {done.returncode}: {' '.join(said[-3:])}")
        return done.stdout

    def submit(self, script: Path, env: dict[str, str]) -> str:
        """sbatch the script; its Slurm job id. ``env`` is the whole environment the job
        starts from (sbatch hands its own to the job): the worker's allow-list, never its
        own, which holds its credentials."""
        out = self._run("sbatch", "--parsable", "--export=ALL", str(script), env=env)
        return out.strip().split(";")[0]  # "id" or "id;cluster"

    def jobs(self) -> dict[str, SlurmJob]:
        """This account's jobs that Slurm still knows, ended ones included (for
        MinJobAge after their end), by id."""
        out = self._run(
            "squeue", "--me", "--noheader", "--states=all", "--format=%i|%T|%r|%N|%M|%k"
        )
        found = {}
        for line in out.splitlines():
            parts = [p.strip() for p in line.split("|", 5)]
            if len(parts) == 6:
                job_id, state, reason, nodes, used, comment = parts
                found[job_id] = SlurmJob(job_id, state, reason, nodes, seconds(used), comment)
        return found

    def cpus_per_node(self, partition: str | None) -> int:
        """The fewest CPUs a node of the partition (default: every node) has."""
        argv = ["sinfo", "--noheader", "--format=%c"]
        if partition:
            argv.append(f"--partition={partition}")
        counts = [int(w) for w in self._run(*argv).split() if w.isdigit()]
        if not counts:
            raise SlurmError(f"sinfo lists no node in partition {partition or '(default)'}")
        return min(counts)

    def exit_code(self, job_id: str) -> str | None:
        """How an ended job's batch script exited ("1:0": code 1; "0:9": signal 9), while
        Slurm still knows it."""
        try:
            out = self._run("scontrol", "show", "job", "--oneliner", job_id)
        except SlurmError:
            return None
        for word in out.split():
            if word.startswith("ExitCode="):
                return word.partition("=")[2]
        return None

    def cancel(self, job_id: str) -> None:
        """scancel the job: its steps get SIGTERM, then SIGKILL after KillWait; a pending
        one is removed. A job Slurm no longer knows is not an error: it is gone."""
        try:
            self._run("scancel", job_id)
        except SlurmError as exc:
            if "Invalid job id" not in str(exc):
                raise


def seconds(elapsed: str) -> float:
    """squeue's time used ("5:03", "1:02:03", "2-01:02:03") in seconds; 0 for anything
    else ("INVALID", a job not started)."""
    days, _, clock = elapsed.rpartition("-")
    try:
        parts = [int(p) for p in clock.split(":")]
        whole_days = int(days or 0)
    except ValueError:
        return 0.0
    if not 2 <= len(parts) <= 3:
        return 0.0
    hours, minutes, secs = [0] * (3 - len(parts)) + parts
    return float(whole_days * 86400 + hours * 3600 + minutes * 60 + secs)
