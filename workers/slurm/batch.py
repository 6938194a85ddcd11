"""The batch script of one attempt on Slurm: what sbatch is asked for, and how the
attempt's runners start on the nodes it gets.

Every option is an ``#SBATCH`` line of the script, which stays in the job's folder
(``.runner/slurm-<attempt>.sh``): what was asked of the cluster can be read there. The
script starts one runner per node with ``srun``; a job on one node runs as on a box, a
job across nodes meets through torch's elastic launch (``workers.runner.node``) with its
rendezvous on the allocation's first node, for recipes and scripts alike.
"""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from service.models import Job
from service.settings import Settings

# The runner's SIGTERM handler checkpoints at the step it is on; Slurm sends SIGTERM this
# long before the time limit, and SIGKILL at it. Trainyard's own timeout (the worker's,
# from when Slurm started the job) comes first: the limit is a backstop past it.
SIGNAL_BEFORE_END_S = 60
TIME_LIMIT_MARGIN_S = 120
# Nodes' and the submit host's clocks may differ by this much (keep them on NTP).
LEASE_WATCH_SLACK_S = 10


@dataclass(frozen=True)
class Attempt:
    """What a batch script is made of: the job, its attempt, and where its files are."""

    job: Job
    attempt: int
    worker_id: str
    handoff: Path  # the hand-off the runners read (no credential in it)
    output: Path  # Slurm writes the job's stdout here ...
    error: Path  # ... and its stderr here
    alive: Path  # when the worker last renewed its leases (seconds since the epoch)
    lease_s: float  # a job whose worker is silent this long stops itself


def name(job_id: int) -> str:
    """The Slurm job name of a Trainyard job: what an operator sees in squeue."""
    return f"trainyard-{job_id}"


def comment(worker_id: str, job_id: int, attempt: int) -> str:
    """What ties a Slurm job to its attempt and to the worker that submitted it: a
    restarted worker adopts its jobs by it, and cancels what no attempt owns. (No space:
    ``#SBATCH`` lines are not a shell's; the worker's id comes last, whatever it holds.)"""
    return f"trainyard/job={job_id}/attempt={attempt}/worker={worker_id}"


_COMMENT = re.compile(r"trainyard/job=(\d+)/attempt=(\d+)/worker=(\S+)")


def parse_comment(text: str) -> tuple[str, int, int] | None:
    """(worker, job, attempt) of a comment ``comment`` wrote; None for any other."""
    found = _COMMENT.fullmatch(text.strip())
    if found is None:
        return None
    return found[3], int(found[1]), int(found[2])


def time_limit(timeout_s: int | None) -> str | None:
    """sbatch --time for a job's timeout_s (minutes:seconds), with room past it for
    Trainyard's own stop; None: the partition's limit."""
    if timeout_s is None:
        return None
    total = timeout_s + SIGNAL_BEFORE_END_S + TIME_LIMIT_MARGIN_S
    return f"{math.ceil(total / 60)}:00"


def options(job: Job, settings: Settings, attempt: Attempt) -> list[str]:
    """The sbatch options, as ``--name=value`` (one ``#SBATCH`` line each)."""
    assert job.id is not None
    opts = [
        f"--job-name={name(job.id)}",
        f"--comment={comment(attempt.worker_id, job.id, attempt.attempt)}",
        f"--nodes={job.nodes}",
        "--ntasks-per-node=1",  # one runner per node; it starts the node's ranks
        # Trainyard decides what a failure means: Slurm neither requeues nor retries.
        "--no-requeue",
        f"--signal=TERM@{SIGNAL_BEFORE_END_S}",  # every step's processes: checkpoint now
        f"--output={attempt.output}",
        f"--error={attempt.error}",
        f"--chdir={attempt.output.parent}",
    ]
    if settings.slurm_gpus_per_node > 0:
        if settings.slurm_gpu_option == "gres":
            opts.append(f"--gres=gpu:{job.devices}")
        else:
            opts.append(f"--gpus-per-node={job.devices}")
        opts.append(f"--cpus-per-task={job.devices}")  # a loader core per rank, at least
    else:  # a CPU partition: a job's devices are its CPUs on each node
        opts.append(f"--cpus-per-task={job.devices}")
    limit = time_limit(job.timeout_s)
    if limit is not None:
        opts.append(f"--time={limit}")
    for flag, value in (
        ("partition", settings.slurm_partition),
        ("account", settings.slurm_account),
        ("qos", settings.slurm_qos),
    ):
        if value:
            opts.append(f"--{flag}={value}")
    opts += shlex.split(settings.slurm_sbatch_options)
    return opts


def script(job: Job, settings: Settings, attempt: Attempt, *, python: str, threads: int) -> str:
    """The batch script: its options, then one runner per node through srun."""
    assert job.id is not None
    accelerator = "cuda" if settings.slurm_gpus_per_node > 0 else "cpu"
    runner = [
        python, "-P", "-m", "workers.runner.main",
        "--job-id", str(job.id),
        "--attempt", str(attempt.attempt),
        "--accelerator", accelerator,
        "--threads", str(threads),
        "--handoff-file", str(attempt.handoff),
    ]  # fmt: skip
    lines = ["#!/bin/bash"]
    # unquoted: sbatch reads these lines as words split at spaces (paths with none: the
    # worker refuses such a DATA_DIR at start)
    lines += [f"#SBATCH {o}" for o in options(job, settings, attempt)]
    lines += [
        "set -eu",
        "export PYTHONUNBUFFERED=1",
        *_lease_watch(attempt),
        "# One runner per node: it starts that node's ranks, as a worker on a box does.",
    ]
    srun = "srun --kill-on-bad-exit=1 --ntasks-per-node=1"
    if job.nodes == 1:
        lines.append(f"exec {srun} {shlex.join(runner)}")
        return "\n".join(lines) + "\n"
    # Across nodes: each node's name and address in the allocation's order (SLURM_NODEID's),
    # and a free port on the first node, where this script runs, for the rendezvous.
    lines += [
        'nodes=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | paste -sd, -)',
        "addresses=$(for n in ${nodes//,/ }; do",
        "    scontrol show node \"$n\" -o | tr ' ' '\\n' | sed -n 's/^NodeAddr=//p'",
        "done | paste -sd, -)",
        f"port=$({shlex.quote(python)} -c 'import socket; s = socket.socket(); "
        's.bind(("", 0)); print(s.getsockname()[1])\')',
        f"exec {srun} {shlex.join(runner)} \\",
        '    --node-from-env SLURM_NODEID --node-workers "$nodes" \\',
        '    --node-addresses "$addresses" --rendezvous "${addresses%%,*}:$port"',
    ]
    return "\n".join(lines) + "\n"


def _lease_watch(attempt: Attempt) -> list[str]:
    """A loop beside the runners: once the worker has not renewed its leases for a whole
    lease (past the clocks' skew, LEASE_WATCH_SLACK_S), on two looks in a row, the job is
    no longer provably its attempt's and cancels itself, as a box's lease watchdog kills
    such an attempt. A file it cannot read (a network filesystem's hiccup) is not a
    silent worker; a scancel that fails is tried again. (Slurm ends the loop with the
    job.)"""
    allowed = int(attempt.lease_s + LEASE_WATCH_SLACK_S)
    return [
        "# Stop if the worker that holds this attempt's lease has gone silent.",
        f"alive={shlex.quote(str(attempt.alive))}",
        "(set +e; stale=0",
        " while sleep 2; do",
        '    last=$(head -c 20 "$alive" 2>/dev/null) || continue',
        '    case "$last" in ""|*[!0-9]*) continue ;; esac',
        f"    if [ $(( $(date +%s) - last )) -gt {allowed} ]; then",
        "        stale=$((stale + 1))",
        "    else",
        "        stale=0",
        "    fi",
        '    if [ "$stale" -ge 2 ]; then',
        f'        echo "trainyard: its worker renewed no lease for over {allowed}s; stopping" >&2',
        '        scancel "$SLURM_JOB_ID" && break',
        "    fi",
        " done) &",
    ]
