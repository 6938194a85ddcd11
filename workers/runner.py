"""The runner: one process per attempt, started by the supervisor in its own process group.

It resolves the spec for this worker, records the environment, trains with the job's
strategy (rank 0 streams progress and metrics to the database, fenced by the attempt's
lease) and leaves a ``RunnerReport`` for the supervisor. It never changes the job's
status: that is the supervisor's job.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from sqlalchemy import Engine

from service import store
from service.db import make_engine
from service.models import Job, Strategy
from service.reasons import ReasonCode
from service.settings import Settings
from service.store import Fence, load_job
from workers import environment, multinode, script, strategies
from workers.blob_cache import BlobCache
from workers.errors import NotRetryable, describe
from workers.handoff import read_stdin
from workers.jobfiles import JobFiles
from workers.memory_limit import apply as limit_memory
from workers.node import Node
from workers.outcome import RunnerReport
from workers.recipes import Recipe, load_package_recipes, load_recipes
from workers.reporter import DbReports
from workers.script_launch import Script
from workers.stdio import prefix_stdio
from workers.training import Preempted, RunSpec, resolve, stop_on_sigterm

log = logging.getLogger(__name__)


def main(argv: list[str] | None = None) -> int:
    """Run one attempt; the exit code says whether it succeeded."""
    parser = argparse.ArgumentParser(prog="python -m workers.runner")
    parser.add_argument("--job-id", type=int, required=True)
    parser.add_argument("--attempt", type=int, required=True)
    parser.add_argument("--accelerator", choices=["cpu", "cuda"], required=True)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--memory-limit", type=int, help="bytes of data per process")
    # a job across boxes: this node's place (workers.multinode)
    parser.add_argument("--node", type=int, help="this node, 0 .. nodes-1")
    parser.add_argument("--rendezvous", help="node 0's address:port")
    parser.add_argument("--node-workers", help="each node's worker, by node, comma-separated")
    args = parser.parse_args(argv)
    if args.memory_limit is not None:  # first: every process of the attempt inherits it
        limit_memory(args.memory_limit)

    # The lease token and the worker's settings come on stdin (workers.handoff): neither
    # on the command line nor in the environment the job's code reads.
    handoff = read_stdin()
    settings = handoff.runner_settings()
    fence = Fence(args.job_id, args.attempt, handoff.lease_token)
    files = JobFiles.of(settings.data_dir, args.job_id, args.node)
    prefix_stdio("[runner] ", args.job_id)
    stop_on_sigterm()  # checkpoint and stop (ddp: the ranks do; this process waits for them)
    try:
        engine = make_engine(settings)
        try:  # one engine to read the job and record its environment
            job = load_job(engine, fence.job_id)
            node = _node(settings, args, job) if args.node is not None else None
            if job.entrypoint is not None:
                prepared = _prepare_script(engine, settings, fence, job, args, node)
            else:
                spec, recipe, params = prepare(engine, settings, fence, job, args)
        finally:
            # Rank 0 makes its own engine where it trains: no connection crosses a fork.
            engine.dispose()
        if job.entrypoint is not None:
            report = script.run(settings, fence, prepared)
        elif node is not None:
            report = multinode.run(spec, node, recipe, params, DbReports(settings, fence))
        else:
            result = strategies.run(spec, DbReports(settings, fence), recipe=recipe, params=params)
            report = RunnerReport(ok=True, result=result)
        if report.ok and not report.leader:
            log.info(
                "attempt %d: this node's ranks are done (global rank 0 is elsewhere)", args.attempt
            )
        elif report.ok:
            log.info("attempt %d succeeded: %s", args.attempt, json.dumps(report.result))
    except Preempted as stop:
        log.info("attempt %d: %s", args.attempt, stop)
        report = RunnerReport(ok=False, preempted=str(stop))
    except BaseException as exc:
        report = RunnerReport(ok=False, error=_error(exc, files, args.attempt))
    report.write(files.outcome(args.attempt))
    sys.stdout.flush()
    sys.stderr.flush()
    return 0 if report.ok else 1


def _node(settings: Settings, args: argparse.Namespace, job: Job) -> Node:
    """This box's node. The others may still be preparing (a script's requirements take
    up to REQUIREMENTS_TIMEOUT_S): the rendezvous waits that long too. (A node whose
    worker died is caught sooner, by the lease: workers.gangs.)"""
    workers = tuple(args.node_workers.split(","))
    preparing = settings.requirements_timeout_s if job.entrypoint is not None else 0.0
    return Node(
        node=args.node,
        nodes=len(workers),
        rendezvous=args.rendezvous,
        workers=workers,
        address=settings.advertise_address,
        timeout_s=settings.gang_timeout_s + preparing,
        socket_ifname=settings.socket_ifname,
    )


def _prepare_script(
    engine: Engine,
    settings: Settings,
    fence: Fence,
    job: Job,
    args: argparse.Namespace,
    node: Node | None,
) -> Script:
    """A script job: its package, data and virtualenv ready, its environment recorded."""
    prepared = script.prepare(
        settings, job, fence.attempt, accelerator=args.accelerator, threads=args.threads, node=node
    )
    record = environment.script_record(
        job, fence.attempt, accelerator=args.accelerator, threads=args.threads,
        python=prepared.argv[0],
    )  # fmt: skip
    _record(engine, fence, JobFiles.of(settings.data_dir, fence.job_id, args.node), record)
    return prepared


def prepare(
    engine: Engine, settings: Settings, fence: Fence, job: Job, args: argparse.Namespace
) -> tuple[RunSpec, Recipe, BaseModel]:
    """Load the job's recipe, resolve the spec, record the environment."""
    recipe, package = _recipe(settings, job, args.node)
    spec, params = resolve(
        job,
        recipe,
        accelerator=args.accelerator,
        threads=args.threads,
        data_dir=settings.data_dir,
        recipes_dir=settings.recipes_dir,
        attempt=fence.attempt,
        package=package,
        shared_dir=settings.shared_dir,
        node=args.node,
    )
    _record(engine, fence, spec.files, environment.record(spec, recipe, worker_id=job.worker_id))
    if spec.strategy != Strategy.ddp:
        prefix_stdio("[rank 0] ", fence.job_id)
    log.info(
        "attempt %d: %s on %d %s device(s)",
        fence.attempt,
        spec.strategy,
        spec.devices,
        spec.accelerator,
    )
    return spec, recipe, params


def _record(engine: Engine, fence: Fence, files: JobFiles, record: dict[str, Any]) -> None:
    """The environment record, as the spec.json artifact and on the job (fenced)."""
    environment.write_spec(files, record)
    store.record_environment(engine, fence, record)


def _recipe(settings: Settings, job: Job, node: int | None) -> tuple[Recipe, Path | None]:
    """The job's recipe: this worker's, or one its code package defines (then the package,
    unpacked, with the job's data files placed under $TRAINYARD_INPUT_DIR)."""
    if job.code is None:
        recipe = load_recipes(settings.recipes_dir).get(job.recipe or "")
        if recipe is None:
            raise NotRetryable(
                ReasonCode.unknown_recipe, f"this worker has no recipe {job.recipe!r}"
            )
        return recipe, None
    assert job.id is not None
    cache = BlobCache(settings)
    package = cache.code(job.code)
    inputs = JobFiles.of(settings.data_dir, job.id, node).inputs
    script.place_inputs(cache, job.data or {}, inputs)
    os.environ["TRAINYARD_INPUT_DIR"] = str(inputs)  # the recipe's ranks inherit it
    try:
        recipes = load_package_recipes(package)
    except Exception as exc:  # the package's own code: the same error every attempt
        raise NotRetryable(
            ReasonCode.unknown_recipe, f"cannot load the package's recipes: {exc}"
        ) from exc
    recipe = recipes.get(job.recipe or "")
    if recipe is None:
        known = ", ".join(sorted(recipes)) or "none"
        raise NotRetryable(
            ReasonCode.unknown_recipe,
            f"the job's package defines no recipe {job.recipe!r} (it defines: {known})",
        )
    return recipe, package


def _error(exc: BaseException, files: JobFiles, attempt: int) -> dict[str, Any]:
    """How the attempt failed: the first failing rank's own report says more than ours."""
    error = describe(exc)
    for path in files.rank_errors(attempt):
        try:
            error = {**json.loads(path.read_text()), "ranks": str(exc)}
            break
        except (OSError, ValueError):
            continue
    # The traceback goes to the job's log too: the last lines before a crash matter most.
    log.error(
        "attempt %d failed: %s: %s\n%s",
        attempt,
        error["type"],
        error["message"],
        "\n".join(error["traceback"]),
    )
    return error


if __name__ == "__main__":
    sys.exit(main())
