"""single, dp and ddp: where each rank runs, how its model is wrapped, how ranks meet.

The loop is in ``workers.ranks.training``. Rank 0 reports from the process it trains in: the
caller's for single and dp, its own for ddp, where it opens its own reporter and leaves
its result in ``JobFiles.result(attempt)`` for this process to read once every rank is
gone. Nothing passes between the processes while they train.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from pydantic import BaseModel
from torch import nn

from workers.errors import NotTheJobs, describe
from workers.jobfiles import write_atomic
from workers.outcome import RunnerReport, how_it_ended
from workers.plan import Launch
from workers.ranks import bootstrap
from workers.ranks.training import Preempted, Reports, RunSpec, Sink, Trainer
from workers.recipes import Recipe, load_package_recipes, load_recipes
from workers.runner.loopback import LOOPBACK, loopback_store, one_box_env
from workers.zygote import RANK_START_ENV

log = logging.getLogger(__name__)

# When one rank dies, how long the others get to exit before SIGTERM, then SIGKILL.
RANK_EXIT_GRACE_S = 3.0


def run(
    spec: RunSpec,
    reports: Reports | None = None,
    *,
    recipe: Recipe | None = None,
    params: BaseModel | None = None,
    gpu_fraction: float | None = None,
) -> dict[str, float]:
    """Train the job with its strategy; returns rank 0's final metrics.

    ``reports``: where rank 0 reports, opened by rank 0 in the process it trains in (its
    own for ddp); None: nowhere. ``recipe``/``params``: loaded and validated once by the
    caller; without them, loaded here from the spec. ``gpu_fraction``: the job's share
    of its GPU, capped in every process that trains.
    """
    if recipe is None or params is None:
        recipe, params = load(spec)
    if spec.plan.launch == Launch.local_ranks:
        return _run_ddp(spec, recipe, params, reports, gpu_fraction)
    device = bootstrap.place(spec, local_rank=0, gpu_fraction=gpu_fraction)
    with _opened(reports) as sink:
        return Trainer(0, spec, recipe, params, device, sink, wrapper(spec, device)).train()


def load(spec: RunSpec) -> tuple[Recipe, BaseModel]:
    """The spec's recipe, imported anew, and its params (already validated once)."""
    if spec.package is not None:  # the job's own package defines it
        recipe = load_package_recipes(Path(spec.package))[spec.recipe]
    else:
        recipe = load_recipes(Path(spec.recipes_dir) if spec.recipes_dir else None)[spec.recipe]
    return recipe, recipe.params.model_validate(spec.params)


def wrapper(spec: RunSpec, device: torch.device) -> Callable[[nn.Module], nn.Module]:
    """How the strategy wraps the (resumed) model: DDP, DataParallel, or not at all."""
    cuda = device.type == "cuda"

    def wrap(model: nn.Module) -> nn.Module:
        if spec.plan.distributed:
            return nn.parallel.DistributedDataParallel(
                model, device_ids=[device.index] if cuda else None
            )
        if spec.plan.data_parallel and cuda:
            return nn.DataParallel(model, device_ids=list(range(spec.devices)))
        # dp on CPU trains the module itself: DataParallel is a pass-through on a box
        # without CUDA, and on a box with it, it would move the module to a GPU.
        return model

    return wrap


def _opened(reports: Reports | None) -> AbstractContextManager[Sink | None]:
    return nullcontext() if reports is None else reports.open()


def _run_ddp(
    spec: RunSpec,
    recipe: Recipe,
    params: BaseModel,
    reports: Reports | None,
    gpu_fraction: float | None,
) -> dict[str, float]:
    # The runner hosts the rendezvous store on loopback only (every rank is on this box),
    # on a port the OS picks: no fixed port, and no window between "find a free port"
    # and "bind it" for a race.
    store = loopback_store(spec.world_size + 1, bootstrap.INIT_TIMEOUT_S)
    # A runner forked from the warm zygote forks its ranks too (torch already imported,
    # CUDA untouched); a runner started as a fresh interpreter spawns them.
    start_method = os.environ.get(RANK_START_ENV, "spawn")
    # Forked ranks inherit the recipe and its params as they are. Spawned ranks would
    # unpickle them, and a recipe file's module (trainyard_recipes_dir.*) exists only in
    # this process: they import the recipe again by name instead (see ``load``).
    loaded = (recipe, params) if start_method == "fork" else None
    context = mp.start_processes(
        _rank_main,
        args=(spec, loaded, store.port, reports, gpu_fraction),
        nprocs=spec.world_size,
        join=False,
        start_method=start_method,
    )
    # join raises once any rank fails; the others then get RANK_EXIT_GRACE_S to exit,
    # SIGTERM, the same again, then SIGKILL (torch's default grace is 30 s each).
    try:
        while not context.join(grace_period=RANK_EXIT_GRACE_S):
            pass
    except Exception as exc:
        # mp.spawn names the first rank it saw fail, often a survivor whose collective
        # broke; how each rank ended tells who really went first (e.g. a SIGKILL).
        raise RanksFailed(_how_ranks_ended(context.processes)) from exc
    report = RunnerReport.read(spec.files.result(spec.attempt))
    if report is None:
        raise RanksFailed("every rank exited cleanly, but rank 0 left no result")
    if report.preempted is not None:
        raise Preempted(report.preempted)
    return report.result or {}


class RanksFailed(RuntimeError, NotTheJobs):
    """A DDP rank failed; the message says how every rank ended. It stands for the
    attempt's failure only where no rank described one of its own (a rank killed from
    outside): a rank whose code raised leaves its error, which the runner reports."""


def _how_ranks_ended(processes: list[Any]) -> str:
    ends = []
    for rank, proc in enumerate(processes):
        ends.append(f"rank {rank} {how_it_ended(proc.exitcode)}")
        # Ranks SIGTERMed by mp.spawn after the first failure show up here too.
    return "; ".join(ends)


def _rank_main(
    rank: int,
    spec: RunSpec,
    loaded: tuple[Recipe, BaseModel] | None,
    port: int,
    reports: Reports | None,
    gpu_fraction: float | None,
) -> None:
    """One DDP rank of a job on this box: join the group on the runner's store, train,
    leave."""
    device = bootstrap.start_rank(
        spec, label=f"[rank {rank}] ", local_rank=rank, gpu_fraction=gpu_fraction
    )
    store = dist.TCPStore(
        LOOPBACK,
        port,
        spec.world_size + 1,
        is_master=False,
        timeout=timedelta(seconds=bootstrap.INIT_TIMEOUT_S),
    )
    train_in_group(rank, spec, loaded, reports, device, socket_env=one_box_env(), store=store)
    bootstrap.leave()


def train_in_group(
    rank: int,
    spec: RunSpec,
    loaded: tuple[Recipe, BaseModel] | None,
    reports: Reports | None,
    device: torch.device,
    *,
    socket_env: dict[str, str],
    store: dist.Store | None = None,
) -> None:
    """A DDP rank in the job's group (``bootstrap.process_group``): train; a failure is
    left in the rank's error file first."""
    try:
        with bootstrap.process_group(spec, device, rank=rank, socket_env=socket_env, store=store):
            recipe, params = loaded or load(spec)
            # Rank 0's reporter is closed (its points written) as this block ends, before
            # the barrier: nothing is left in it when the rank leaves (with os._exit).
            with _opened(reports if rank == 0 else None) as sink:
                _train_rank(rank, spec, recipe, params, device, sink)
    except BaseException as exc:
        write_atomic(spec.files.rank_error(spec.attempt, rank), json.dumps(describe(exc, rank)))
        raise


def _train_rank(
    rank: int,
    spec: RunSpec,
    recipe: Recipe,
    params: BaseModel,
    device: torch.device,
    sink: Sink | None,
) -> None:
    """Train; rank 0 leaves how it ended (its metrics, or where it stopped) for the runner."""
    try:
        result = Trainer(rank, spec, recipe, params, device, sink, wrapper(spec, device)).train()
        report = RunnerReport(ok=True, result=result)
    except Preempted as stop:  # every rank stops at the same step, checkpoint written
        report = RunnerReport(ok=False, preempted=str(stop))
    if rank == 0:
        report.write(spec.files.result(spec.attempt))
