"""The runner: one process per attempt, started by the supervisor in its own process group.

It resolves the spec for this worker, writes the environment record, trains with the
job's strategy (rank 0 appends progress and metrics to a file the supervisor stores) and
leaves a ``RunnerReport`` for the supervisor. It holds no credential and never touches
the database: the job and its settings come on its stdin (``workers.handoff``), and
everything it says goes through the job's folder.
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

from service.models import Job, Strategy
from service.reasons import ReasonCode
from workers import environment, multinode, script, strategies
from workers.errors import Described, NotRetryable, describe
from workers.handoff import JobSettings, read_stdin
from workers.jobfiles import JobFiles, write_atomic
from workers.memory_limit import apply as limit_memory
from workers.node import Node
from workers.outcome import RunnerReport
from workers.points_file import PointsFile
from workers.recipes import Recipe, load_package_recipes, load_recipes
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

    # The job and its settings come on stdin (workers.handoff), once the supervisor has
    # placed the job's inputs: neither on the command line nor in the environment.
    handoff = read_stdin()
    settings = handoff.settings
    files = JobFiles.of(settings.data_dir, args.job_id, args.node)
    prefix_stdio("[runner] ", args.job_id)
    stop_on_sigterm()  # checkpoint and stop (ddp: the ranks do; this process waits for them)
    try:
        if handoff.inputs_error is not None:
            raise Described(handoff.inputs_error)
        job = handoff.the_job()
        node = _node(settings, args, job) if args.node is not None else None
        points = PointsFile(files.points(args.attempt))
        if job.entrypoint is not None:
            assert handoff.package is not None  # a script job brings its code
            prepared = _prepare_script(settings, job, args, node, handoff.package)
            report = script.run(prepared, points)
        else:
            spec, recipe, params = prepare(settings, job, args, handoff.package)
            if node is not None:
                report = multinode.run(spec, node, recipe, params, points)
            else:
                result = strategies.run(spec, points, recipe=recipe, params=params)
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


def _node(settings: JobSettings, args: argparse.Namespace, job: Job) -> Node:
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
    settings: JobSettings,
    job: Job,
    args: argparse.Namespace,
    node: Node | None,
    package: Path,
) -> Script:
    """A script job: its virtualenv ready, its environment recorded."""
    prepared = script.prepare(
        settings, job, args.attempt, package,
        accelerator=args.accelerator, threads=args.threads, node=node,
    )  # fmt: skip
    record = environment.script_record(
        job, args.attempt, accelerator=args.accelerator, threads=args.threads,
        python=prepared.argv[0],
    )  # fmt: skip
    _record(JobFiles.of(settings.data_dir, args.job_id, args.node), args.attempt, record)
    return prepared


def prepare(
    settings: JobSettings, job: Job, args: argparse.Namespace, package: Path | None = None
) -> tuple[RunSpec, Recipe, BaseModel]:
    """Load the job's recipe, resolve the spec, record the environment."""
    recipe = _recipe(settings, job, args.node, package)
    spec, params = resolve(
        job,
        recipe,
        accelerator=args.accelerator,
        threads=args.threads,
        data_dir=settings.data_dir,
        recipes_dir=settings.recipes_dir,
        attempt=args.attempt,
        package=package,
        shared_dir=settings.shared_dir,
        node=args.node,
    )
    _record(spec.files, args.attempt, environment.record(spec, recipe, worker_id=job.worker_id))
    if spec.strategy != Strategy.ddp:
        prefix_stdio("[rank 0] ", args.job_id)
    log.info(
        "attempt %d: %s on %d %s device(s)",
        args.attempt,
        spec.strategy,
        spec.devices,
        spec.accelerator,
    )
    return spec, recipe, params


def _record(files: JobFiles, attempt: int, record: dict[str, Any]) -> None:
    """The environment record, as the spec.json artifact and for the supervisor to store
    on the job."""
    environment.write_spec(files, record)
    write_atomic(files.environment(attempt), json.dumps(record))


def _recipe(settings: JobSettings, job: Job, node: int | None, package: Path | None) -> Recipe:
    """The job's recipe: this worker's, or one its code package defines (the package
    unpacked, and the job's data files under $TRAINYARD_INPUT_DIR, by the supervisor)."""
    if package is None:
        recipe = load_recipes(settings.recipes_dir).get(job.recipe or "")
        if recipe is None:
            raise NotRetryable(
                ReasonCode.unknown_recipe, f"this worker has no recipe {job.recipe!r}"
            )
        return recipe
    assert job.id is not None
    inputs = JobFiles.of(settings.data_dir, job.id, node).inputs
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
    return recipe


def _error(exc: BaseException, files: JobFiles, attempt: int) -> dict[str, Any]:
    """How the attempt failed: the first failing rank's own report says more than ours."""
    error = exc.error if isinstance(exc, Described) else describe(exc)
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
