"""The runner: one process per attempt, started by the supervisor in its own process group.

It resolves the spec for this worker, trains with the job's strategy, streams progress
and metrics to the database (fenced by the attempt's lease), and leaves an outcome file
for the supervisor. It never changes the job's status: that is the supervisor's job.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pydantic

from service import store
from service.artifacts import job_dir
from service.db import make_engine
from service.models import Job
from service.settings import Settings
from service.store import Fence, load_job
from workers import environment, strategies
from workers.attempt import outcome_path
from workers.errors import NotRetryable, describe
from workers.recipes import Recipe, load_recipes
from workers.reporter import DbReporter
from workers.stdio import prefix_stdio
from workers.training import FLUSHED_MARKER, Preempted, RunSpec, stop_on_sigterm

log = logging.getLogger(__name__)

SPEC_FILE = "spec.json"


def resolve(
    job: Job,
    recipe: Recipe,
    *,
    accelerator: str,
    threads: int,
    settings: Settings,
    attempt: int = 1,
) -> RunSpec:
    """Turn 'auto' into concrete choices for this worker and check the recipe params."""
    assert job.id is not None
    acc = accelerator if job.accelerator == "auto" else str(job.accelerator)
    strategy = str(job.strategy)
    if strategy == "auto":
        strategy = "ddp" if job.devices > 1 else "single"
    if strategy == "dp" and acc == "cpu" and job.devices > 1:
        raise NotRetryable("bad_spec", "dp (DataParallel) needs CUDA devices; use ddp on CPU")
    try:
        params = recipe.params.model_validate(job.params).model_dump()
    except pydantic.ValidationError as exc:
        raise NotRetryable("bad_params", f"recipe {recipe.name} rejected params: {exc}") from exc
    return RunSpec(
        job_id=job.id,
        recipe=job.recipe,
        params=params,
        strategy=strategy,
        accelerator=acc,
        devices=job.devices,
        epochs=job.epochs,
        batch_size=job.batch_size,
        lr=job.lr,
        optimizer=str(job.optimizer),
        seed=job.seed,
        precision=str(job.precision),
        checkpoint_every=job.checkpoint_every,
        job_dir=str(job_dir(settings.data_dir, job.id)),
        recipes_dir=str(settings.recipes_dir) if settings.recipes_dir else None,
        threads=threads,
        attempt=attempt,
    )


def write_spec(folder: Path, record: dict[str, Any]) -> None:
    """The resolved spec and its environment as an artifact: what exactly was trained."""
    spec = record["spec"]
    path = folder / SPEC_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{SPEC_FILE}.tmp")
    # The spec's fields at the top level (what a rerun needs), the environment beside them.
    tmp.write_text(json.dumps({**spec, "environment": record}, indent=2, sort_keys=True))
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    """Run one attempt; the exit code says whether it succeeded."""
    parser = argparse.ArgumentParser(prog="python -m workers.runner")
    parser.add_argument("--job-id", type=int, required=True)
    parser.add_argument("--attempt", type=int, required=True)
    parser.add_argument("--lease-token", required=True)
    parser.add_argument("--accelerator", choices=["cpu", "cuda"], required=True)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)

    settings = Settings()
    fence = Fence(args.job_id, args.attempt, args.lease_token)
    out = outcome_path(settings.data_dir, args.job_id, args.attempt)
    out.parent.mkdir(parents=True, exist_ok=True)
    prefix_stdio("[runner] ", args.job_id)
    stop_on_sigterm()  # checkpoint and stop (ddp: the ranks do; this process waits for them)
    engine = make_engine(settings)
    reporter = DbReporter(
        engine,
        fence,
        on_lease_lost=_kill_own_group,
        flushed_marker=job_dir(settings.data_dir, args.job_id) / FLUSHED_MARKER,
        lease_s=settings.lease_s,
    ).start()
    try:
        job = load_job(engine, args.job_id)
        recipes = load_recipes(settings.recipes_dir)
        if job.recipe not in recipes:
            raise NotRetryable("unknown_recipe", f"this worker has no recipe {job.recipe!r}")
        recipe = recipes[job.recipe]
        spec = resolve(
            job,
            recipe,
            accelerator=args.accelerator,
            threads=args.threads,
            settings=settings,
            attempt=args.attempt,
        )
        record = environment.record(spec, recipe, worker_id=job.worker_id)
        write_spec(Path(spec.job_dir), record)
        store.record_environment(engine, fence, record)
        if spec.strategy != "ddp":
            prefix_stdio("[rank 0] ", args.job_id)
        log.info(
            "attempt %d: %s on %d %s device(s)",
            args.attempt,
            spec.strategy,
            spec.devices,
            spec.accelerator,
        )
        result = strategies.run(spec, reporter)
    except Preempted as stop:
        reporter.close()
        log.info("attempt %d: %s", args.attempt, stop)
        _write_outcome(out, {"ok": False, "preempted": str(stop)})
        return 1
    except BaseException as exc:
        reporter.close()
        error = describe(exc)
        rank_error = _rank_error(out.parent, args.attempt)
        if rank_error is not None:  # the rank's own traceback, plus how every rank ended
            error = {**rank_error, "ranks": str(exc)}
        # The traceback goes to the job's log too: the last lines before a crash matter most.
        log.error(
            "attempt %d failed: %s: %s\n%s",
            args.attempt,
            error["type"],
            error["message"],
            "\n".join(error["traceback"]),
        )
        _write_outcome(out, {"ok": False, "error": error})
        return 1
    reporter.close()
    _write_outcome(out, {"ok": True, "result": result})
    log.info("attempt %d succeeded: %s", args.attempt, json.dumps(result))
    return 0


def _kill_own_group() -> None:
    """Another worker owns the job now: nothing this attempt does can count, so stop it all."""
    log.error("lease lost: stopping every process of this attempt")
    os.killpg(0, signal.SIGKILL)


def _rank_error(runner_dir: Path, attempt: int) -> dict[str, Any] | None:
    """The first rank's own error report, which says more than mp.spawn's wrapper."""
    for path in sorted(runner_dir.glob(f"attempt-{attempt}-rank-*-error.json")):
        try:
            error: dict[str, Any] = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        return error
    return None


def _write_outcome(path: Path, outcome: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(outcome))
    os.replace(tmp, path)
    sys.stdout.flush()
    sys.stderr.flush()


if __name__ == "__main__":
    sys.exit(main())
