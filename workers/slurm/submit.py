"""What one attempt's Slurm job is made of, written into the job's folder before sbatch:
its inputs placed, its hand-off (no credential), its batch script; and the environment
sbatch hands the job."""

from __future__ import annotations

import os
from pathlib import Path

from service.models import Accelerator
from service.settings import Settings
from workers.errors import describe
from workers.handoff import Handoff, JobSettings
from workers.jobfiles import JobFiles, write_atomic
from workers.slurm import batch
from workers.slurm.attempt import Submitted
from workers.supervisor import inputs
from workers.supervisor.launch import clear_attempt, runner_env


def write_attempt(
    settings: Settings,
    attempt: Submitted,
    *,
    worker_id: str,
    alive: Path,
    python: str,
    accelerator: Accelerator,
) -> Path:
    """Place the job's inputs, write its hand-off and batch script; the script's path."""
    job, fence = attempt.job, attempt.fence
    handoff = Handoff(
        job=job.model_dump(mode="json", exclude={"lease_token"}),
        # a job across nodes checkpoints in its own folder: DATA_DIR is shared (a Slurm
        # worker keeps nothing in the object store: the cluster's filesystem is shared)
        settings=JobSettings.of(settings).model_copy(
            update={"shared_dir": settings.data_dir.resolve(), "checkpoints_in_store": False}
        ),
    )
    # What an earlier run of this attempt number left (a preempted attempt keeps its
    # number) must not speak for this one: its report, points, output, markers.
    main = JobFiles.of(settings.data_dir, fence.job_id)
    for files in {main.runner: main, **{f.runner: f for f in attempt.files}}.values():
        (files.root / files.runner).mkdir(parents=True, exist_ok=True)
        clear_attempt(files, fence.attempt)
    for files in attempt.files:
        try:
            handoff.package, _ = inputs.place(settings, job, files)
        except Exception as exc:  # the runner reports it as the attempt's failure
            handoff.inputs_error = describe(exc)
    runner = main.root / main.runner
    path = runner / f"attempt-{fence.attempt}-handoff.json"
    write_atomic(path, handoff.model_dump_json())
    spec = batch.Attempt(
        job=job,
        attempt=fence.attempt,
        worker_id=worker_id,
        handoff=path,
        output=attempt.logs[0].path,
        error=attempt.logs[1].path,
        alive=alive,
        lease_s=settings.lease_s,
    )
    processes = job.devices if job.strategy == "ddp" else 1
    threads = 1 if accelerator == Accelerator.cuda else max(1, job.devices // processes)
    script = runner / f"attempt-{fence.attempt}-slurm.sh"
    write_atomic(script, batch.script(job, settings, spec, python=python, threads=threads))
    return script


def job_env() -> dict[str, str]:
    """What a batch job starts from (sbatch hands it its own environment): the allow-list
    a box's runner gets, and Slurm's own client settings. Never the worker's environment,
    which holds the database URL and the API token."""
    env = runner_env()
    env.update({k: v for k, v in os.environ.items() if k.startswith("SLURM_")})
    env["PATH"] = os.environ.get("PATH", os.defpath)
    return env
