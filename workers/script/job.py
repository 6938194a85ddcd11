"""A script job's attempt: the user's own entrypoint, run in its unpacked package.

``single`` and ``dp`` run the entrypoint as one process that sees the job's devices, with
``MASTER_ADDR``/``MASTER_PORT`` free on loopback, so a script that calls ``mp.spawn`` and
``init_process_group`` itself runs as it is. ``ddp`` starts it once per device through
PyTorch's own launcher (the elastic launch API that ``torchrun`` runs, c10d rendezvous
on loopback): a script that runs under ``torchrun`` runs here unchanged; across boxes
(``nodes`` > 1) each box's part meets the others' as ``workers.runner.node`` says, and
``$TRAINYARD_CHECKPOINT_DIR`` is in the folder every box shares.

The script's environment is an allow-list (no database URL, no API token) plus the
job's own variables (``job_env``). The runner follows ``$TRAINYARD_METRICS_FILE`` into
the points file the supervisor stores, keeps the tail of the script's stderr for the
job's ``error`` and its reason (the failing rank's last lines: the cause, as a
traceback ends), and turns how the script ended into the attempt's ``RunnerReport``.

SIGTERM means "checkpoint now and exit": the supervisor sends it to the attempt's whole
process group (for ddp the launch passes it on to the ranks); a script that exits
within the grace period after it goes back to the queue without spending an attempt.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
from pathlib import Path

from service.jobspec import resolve_strategy
from service.models import Job
from service.reasons import ReasonCode
from workers.env_allowlist import inherited
from workers.errors import TRACEBACK_LINES, peer_gone_in, ran_out_in
from workers.handoff import JobSettings
from workers.jobfiles import JobFiles, shared_checkpoints
from workers.outcome import STDERR_REASON_LINES, RunnerReport
from workers.plan import Launch, LaunchPlan
from workers.points_file import PointsFile
from workers.runner.loopback import LOOPBACK, one_box_env
from workers.runner.node import Node
from workers.script.launch import Script, free_port, rank_lines, run_process, run_ranks
from workers.script.metrics_file import MetricsFile
from workers.script.venvs import python_for
from workers.venv_names import requirement_lines

log = logging.getLogger(__name__)

METRICS_POLL_S = 0.5
JOB_PATH = Path(__file__).with_name("job_path")  # trainyard_job, on the script's PYTHONPATH
PYTHON_NAMES = ("python", "python3", f"python3.{sys.version_info.minor}")


def prepare(
    settings: JobSettings,
    job: Job,
    attempt: int,
    package: Path,
    *,
    accelerator: str,
    threads: int,
    node: Node | None = None,
) -> Script:
    """Build the requirements' virtualenv and the script's environment, in the package
    the supervisor unpacked (``node``: this box's part of a job across boxes)."""
    assert job.id is not None and job.code is not None and job.entrypoint is not None
    files = JobFiles.of(settings.data_dir, job.id, None if node is None else node.node)
    # across boxes, kept where the next attempt's nodes find it, on any box
    shared = shared_checkpoints(job, settings.shared_dir, in_store=settings.checkpoints_in_store)
    checkpoints = files.checkpoints if shared is None else Path(shared)
    for folder in (files.output, checkpoints):
        folder.mkdir(parents=True, exist_ok=True)
    metrics = files.metrics_file(attempt)
    metrics.parent.mkdir(parents=True, exist_ok=True)
    metrics.touch(mode=0o600)  # the script appends; the runner follows
    python = python_for(
        requirement_lines(job.requirements, package),
        settings.cache_dir,
        package,
        timeout_s=settings.requirements_timeout_s,
        sealed_by=settings.venvs_sealed_by,
        private=files.root / files.runner / "venvs",
    )
    env = job_env(job, attempt, files, accelerator=accelerator, threads=threads, python=python)
    env["TRAINYARD_CHECKPOINT_DIR"] = str(checkpoints)
    if node is not None:
        env.update(
            node.socket_env(), TRAINYARD_NODE=str(node.node), TRAINYARD_NODES=str(node.nodes)
        )
    program, *args = job.entrypoint
    argv = [python if program in PYTHON_NAMES else program, *args]
    plan = LaunchPlan.of(resolve_strategy(job.strategy, job.devices), job.devices, job.nodes)
    if plan.launch == Launch.in_process:
        return Script(argv, package, env, metrics)
    return Script(
        argv,
        package,
        env,
        metrics,
        ranks=job.devices,
        run_id=f"trainyard-job-{job.id}-attempt-{attempt}",
        logs=files.torchrun_logs,
        node=node,
    )


def job_env(
    job: Job, attempt: int, files: JobFiles, *, accelerator: str, threads: int, python: str
) -> dict[str, str]:
    """The script's environment: the allow-list (``workers.env_allowlist``), then the job's own
    variables."""
    assert job.id is not None
    env = inherited()
    bin_dir = str(Path(python).parent)
    env.update(
        PATH=f"{bin_dir}:{env.get('PATH', '/usr/bin:/bin')}",
        PYTHONPATH=str(JOB_PATH),
        PYTHONUNBUFFERED="1",  # lines reach the job's log as they are printed
        OMP_NUM_THREADS=str(threads),
        MASTER_ADDR=LOOPBACK,
        MASTER_PORT=str(free_port()),
        **one_box_env(),  # the script's gloo and NCCL listen on loopback too
        TRAINYARD_JOB_ID=str(job.id),
        TRAINYARD_ATTEMPT=str(attempt),
        TRAINYARD_DEVICES=str(job.devices),
        TRAINYARD_ACCELERATOR=accelerator,
        TRAINYARD_OUTPUT_DIR=str(files.output),
        TRAINYARD_CHECKPOINT_DIR=str(files.checkpoints),
        TRAINYARD_INPUT_DIR=str(files.inputs),
        TRAINYARD_METRICS_FILE=str(files.metrics_file(attempt)),
        # the job's params (a sweep's trial values among them), for the script to read
        TRAINYARD_PARAMS=json.dumps(job.params, separators=(",", ":")),
    )
    if accelerator == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""  # a CPU job must not find the box's GPUs
    return env


def run(script: Script, points: PointsFile) -> RunnerReport:
    """Run the script to its end, following its metrics; how it ended, as a report."""
    terminated = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: terminated.set())
    log.info("running %s in %s", " ".join(script.argv), script.cwd)
    with points.open() as reporter:
        metrics = MetricsFile(script.metrics, reporter)
        done = threading.Event()
        follower = threading.Thread(
            target=_follow, args=(metrics, done), name="metrics-file", daemon=True
        )
        follower.start()
        try:
            ranks = script.ranks is not None
            ended = run_ranks(script, terminated) if ranks else run_process(script)
        finally:
            done.set()
            follower.join()
        metrics.poll()  # what it wrote last
    if ended.cannot_start:
        return _failed(ended.how, [], retryable=False)
    if terminated.is_set():
        return RunnerReport(ok=False, preempted=f"the script {ended.how} after SIGTERM")
    if ended.ok:
        return RunnerReport(ok=True, result=metrics.final(), leader=ended.leader)
    # The failing rank's own last words, its files named as in the user's package (not
    # under the worker's cache: '  File "train.py", line 3').
    package = f"{script.cwd}/"
    tail = [line.replace(package, "") for line in rank_lines(ended.tail, ended.rank)]
    if ran_out_in(tail):  # under its memory limit: the same spec would run out again
        message = f"the script ran out of memory ({ended.how})"
        return _failed(message, tail, code=ReasonCode.out_of_memory)
    # A rank whose collective broke when another went away says so last: the other's
    # failure, or the box's, is not the script's own.
    own = not ended.outside and not peer_gone_in(tail)
    return _failed(f"the script {ended.how}", tail, retryable=True, own=own)


def _follow(metrics: MetricsFile, done: threading.Event) -> None:
    while not done.wait(METRICS_POLL_S):
        metrics.poll()


def _failed(
    message: str,
    tail: list[str],
    *,
    retryable: bool = False,
    code: ReasonCode = ReasonCode.error,
    own: bool = True,
) -> RunnerReport:
    return RunnerReport(
        ok=False,
        error={
            "type": "ScriptFailed",
            "message": message,
            "plain": True,  # the reason reads "the script exited with 1", no type before it
            "traceback": tail[-TRACEBACK_LINES:],
            "stderr": tail[-STDERR_REASON_LINES:],  # the cause, in the reason itself
            "rank": None,
            "code": code,
            "retryable": retryable,
            "own": own,
        },
    )
