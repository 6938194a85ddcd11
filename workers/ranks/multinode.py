"""A recipe job across several boxes: this box's part of it (``workers.runner.node`` says how
the nodes meet).

The node with global rank 0 is the leader: its rank 0 reports progress and metrics and
writes the final weights; every node's ranks read and write the checkpoints in the
folder all boxes share (``SHARED_DIR``), so the next attempt resumes wherever it runs.
"""

from __future__ import annotations

import logging
import os
import warnings

from pydantic import BaseModel

from workers.outcome import RunnerReport
from workers.ranks import bootstrap, strategies
from workers.ranks.training import Preempted, Reports, RunSpec
from workers.recipes import Recipe
from workers.runner.node import Node, launch_config, not_met
from workers.zygote import RANK_START_ENV

log = logging.getLogger(__name__)


def run(
    spec: RunSpec,
    node: Node,
    recipe: Recipe,
    params: BaseModel,
    reports: Reports | None,
    gpu_fraction: float | None = None,
) -> RunnerReport:
    """Train this node's ranks; the report says whether global rank 0 was here."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import RendezvousError
    from torch.distributed.launcher.api import elastic_launch

    # Forked ranks (a runner forked from the warm zygote) inherit the recipe as loaded;
    # spawned ones load it again by name (see strategies.load).
    start_method = os.environ.get(RANK_START_ENV, "spawn")
    loaded = (recipe, params) if start_method == "fork" else None
    config = launch_config(
        node,
        ranks=spec.devices,
        run_id=f"trainyard-job-{spec.job_id}-attempt-{spec.attempt}",
        start_method=start_method,
        logs_specs=DefaultLogsSpecs(log_dir=str(spec.files.torchrun_logs)),
    )
    logging.getLogger("torch.distributed.elastic").setLevel(logging.WARNING)
    # A forked rank's stderr is the runner's line prefixer, which has no file descriptor
    # for faulthandler: torch warns so, in two lines per rank, and carries on.
    warnings.filterwarnings("ignore", message="Unable to enable fault handler")
    try:
        elastic_launch(config, entrypoint=_rank_main)(spec, node, loaded, reports, gpu_fraction)
    except RendezvousError as exc:
        raise not_met(node, config, exc) from exc
    except SignalException as stop:  # the agent passed SIGTERM on and waited
        raise Preempted(f"stopped ({stop.sigval.name})") from stop
    except ChildFailedError as failed:
        rank, failure = failed.get_first_failure()
        raise strategies.RanksFailed(
            f"node {node.node}'s rank {rank} failed: {failure.message or failure.exitcode}"
        ) from failed
    report = RunnerReport.read(spec.files.result(spec.attempt))
    if report is None:  # global rank 0 was on another node: it reports the job's result
        return RunnerReport(ok=True, leader=False)
    if report.preempted is not None:
        raise Preempted(report.preempted)
    return report


def _rank_main(
    spec: RunSpec,
    node: Node,
    loaded: tuple[Recipe, BaseModel] | None,
    reports: Reports | None,
    gpu_fraction: float | None,
) -> None:
    """One rank, as the elastic launch starts it (``RANK``, ``LOCAL_RANK``,
    ``WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT`` of the agent's store in its
    environment): join the global group and train as any DDP rank does."""
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    device = bootstrap.start_rank(
        spec,
        label=f"[node {node.node} rank {rank}] ",
        local_rank=local_rank,
        gpu_fraction=gpu_fraction,
    )
    log.info("rank %d is on node %d of %d", rank, node.node, node.nodes)
    strategies.train_in_group(rank, spec, loaded, reports, device, socket_env=node.socket_env())
