"""The runner: one process per attempt, started by the supervisor in its own process group.

It resolves the spec for this worker, writes the environment record, trains with the
job's strategy (rank 0 appends progress and metrics to a file the supervisor stores) and
leaves a ``RunnerReport`` for the supervisor. It holds no credential and never touches
the database: the job and its settings come on its stdin (``workers.handoff``), and
everything it says goes through the job's folder.

Its walls go up in order, before any of the job's code runs: the memory limit, then the
job's account (where the worker is root), then, once a script's requirements are
installed (pip needs the network), a network of its own (``workers.runner.confine``).
This module imports nothing heavy at the top for that reason: torch starts a thread as
it is imported, and a process with threads cannot enter a user namespace. (A runner
forked from the warm zygote has all of it imported, and one thread.)
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from service.models import Job
from service.reasons import ReasonCode
from workers.errors import Described, NotRetryable, describe
from workers.handoff import Handoff, JobSettings, read_file, read_stdin
from workers.jobfiles import JobFiles, write_atomic
from workers.outcome import RunnerReport
from workers.plan import Launch
from workers.points_file import PointsFile
from workers.runner import confine
from workers.runner.limits import limit_memory
from workers.runner.node import Node
from workers.script import job as script
from workers.script.launch import Script
from workers.stdio import prefix_stdio
from workers.stopping import Preempted, stop_on_sigterm

if TYPE_CHECKING:
    from pydantic import BaseModel

    from workers.ranks.training import RunSpec
    from workers.recipes import Recipe

log = logging.getLogger(__name__)


def main(argv: list[str] | None = None) -> int:
    """Run one attempt; the exit code says whether it succeeded."""
    parser = argparse.ArgumentParser(prog="python -m workers.runner.main")
    parser.add_argument("--job-id", type=int, required=True)
    parser.add_argument("--attempt", type=int, required=True)
    parser.add_argument("--accelerator", choices=["cpu", "cuda"], required=True)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--memory-limit", type=int, help="bytes of data per process")
    # a job across boxes: this node's place (workers.ranks.multinode)
    parser.add_argument("--node", type=int, help="this node, 0 .. nodes-1")
    parser.add_argument("--rendezvous", help="node 0's address:port")
    parser.add_argument("--node-workers", help="each node's worker, by node, comma-separated")
    # a batch job on Slurm (workers.slurm): srun starts the same command on every node
    parser.add_argument("--handoff-file", type=Path, help="read the hand-off from this file")
    parser.add_argument(
        "--node-from-env", metavar="VAR", help="this node's index is in this variable"
    )
    parser.add_argument("--node-addresses", help="each node's address, by node, comma-separated")
    args = parser.parse_args(argv)
    if args.node_from_env is not None:
        args.node = int(os.environ[args.node_from_env])
    if args.memory_limit is not None:  # first: every process of the attempt inherits it
        limit_memory(args.memory_limit)

    # The job and its settings come on stdin (workers.handoff), once the supervisor has
    # placed the job's inputs: neither on the command line nor in the environment.
    handoff = read_stdin() if args.handoff_file is None else read_file(args.handoff_file)
    if handoff.account is not None:  # nothing runs as root past here
        confine.become(handoff.account)
    settings = handoff.settings
    files = JobFiles.of(settings.data_dir, args.job_id, args.node)
    prefix_stdio("[runner] ", args.job_id)
    stop_on_sigterm()  # checkpoint and stop (ddp: the ranks do; this process waits for them)
    try:
        if handoff.inputs_error is not None:
            raise Described(handoff.inputs_error)
        job = handoff.the_job()
        node = _node(settings, args, job) if args.node is not None else None
        prepared = None
        if job.entrypoint is not None:  # its requirements first: pip needs the network
            assert handoff.package is not None  # a script job brings its code
            prepared = script.prepare(
                settings, job, args.attempt, handoff.package,
                accelerator=args.accelerator, threads=args.threads, node=node,
            )  # fmt: skip
        if handoff.isolate_network:  # from here on, only the job's own loopback
            confine.isolate_network()
        report = _run(handoff, job, args, node, prepared, PointsFile(files.points(args.attempt)))
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


def _run(
    handoff: Handoff,
    job: Job,
    args: argparse.Namespace,
    node: Node | None,
    prepared: Script | None,
    points: PointsFile,
) -> RunnerReport:
    """Train the job (or run its script) inside the walls; how it ended."""
    if prepared is not None:
        _record_script(handoff.settings, job, args, prepared)
        return script.run(prepared, points)
    # Heavy, and so imported only now (see the module's docstring).
    from workers.ranks import multinode, strategies

    spec, recipe, params = prepare(handoff.settings, job, args, handoff.package)
    fraction = handoff.gpu_fraction
    if node is not None:
        return multinode.run(spec, node, recipe, params, points, gpu_fraction=fraction)
    result = strategies.run(spec, points, recipe=recipe, params=params, gpu_fraction=fraction)
    return RunnerReport(ok=True, result=result)


def _node(settings: JobSettings, args: argparse.Namespace, job: Job) -> Node:
    """This box's node. The others may still be preparing (a script's requirements take
    up to REQUIREMENTS_TIMEOUT_S): the rendezvous waits that long too. (A node whose
    worker died is caught sooner, by the lease: workers.supervisor.gangs.)"""
    workers = tuple(args.node_workers.split(","))
    preparing = settings.requirements_timeout_s if job.entrypoint is not None else 0.0
    address = settings.advertise_address
    if args.node_addresses is not None:  # on Slurm: the nodes' own, as the cluster names them
        address = args.node_addresses.split(",")[args.node]
    return Node(
        node=args.node,
        nodes=len(workers),
        rendezvous=args.rendezvous,
        workers=workers,
        address=address,
        timeout_s=settings.gang_timeout_s + preparing,
        socket_ifname=settings.socket_ifname,
    )


def _record_script(
    settings: JobSettings, job: Job, args: argparse.Namespace, prepared: Script
) -> None:
    """A script job's environment record."""
    from workers.runner import environment

    record = environment.script_record(
        job, args.attempt, accelerator=args.accelerator, threads=args.threads,
        python=prepared.argv[0],
    )  # fmt: skip
    _record(JobFiles.of(settings.data_dir, args.job_id, args.node), args.attempt, record)


def prepare(
    settings: JobSettings, job: Job, args: argparse.Namespace, package: Path | None = None
) -> tuple[RunSpec, Recipe, BaseModel]:
    """Load the job's recipe, resolve the spec, record the environment."""
    from workers.ranks.training import resolve
    from workers.runner import environment

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
        in_store=settings.checkpoints_in_store,
        node=args.node,
    )
    _record(spec.files, args.attempt, environment.record(spec, recipe, worker_id=job.worker_id))
    if spec.plan.launch == Launch.in_process:  # rank 0 trains in this process
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
    from workers.runner import environment

    environment.write_spec(files, record)
    write_atomic(files.environment(attempt), json.dumps(record))


def _recipe(settings: JobSettings, job: Job, node: int | None, package: Path | None) -> Recipe:
    """The job's recipe: this worker's, or one its code package defines (the package
    unpacked, and the job's data files under $TRAINYARD_INPUT_DIR, by the supervisor)."""
    from workers.recipes import load_package_recipes, load_recipes

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
    """How the attempt failed: a failing rank's own report says more than ours; the first
    whose code raised, else the first (a survivor whose collective broke: whoever broke
    it left no report, so the failure is not the job's own)."""
    # the supervisor could not place the job's inputs: the box's failure
    error = {**exc.error, "own": False} if isinstance(exc, Described) else describe(exc)
    ranks = []
    for path in files.rank_errors(attempt):
        try:
            ranks.append({**json.loads(path.read_text()), "ranks": str(exc)})
        except (OSError, ValueError):
            continue
    if ranks:
        error = next((e for e in ranks if e.get("own", True)), ranks[0])
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
