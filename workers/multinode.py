"""One DDP job across several boxes: this box's part of it.

Each node's runner starts its ranks through PyTorch's elastic launch (the API torchrun
runs), with c10d's rendezvous: ``min_nodes = max_nodes = nodes``, no restarts (a failed
attempt is the supervisors' to retry, as one), and a run id per attempt, so a rank left
over from an earlier attempt can never join this one. The rendezvous store is served by
node 0's runner on the address its worker advertises (``ADVERTISE_ADDRESS``), on the
port it chose when it joined the gang; every rank's ``init_process_group`` meets on that
same store (``workers.loopback``'s handler), so nothing else listens.

``RANK`` and ``WORLD_SIZE`` are global; torch's rendezvous orders the nodes, so global
rank 0 may be on any of them: that node's rank 0 reports progress and metrics, writes
the checkpoints (into ``SHARED_DIR``, which every node reads when the next attempt
resumes) and the final weights, and its runner reports the job's result (``leader``).
"""

from __future__ import annotations

import ipaddress
import logging
import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from pydantic import BaseModel

from workers import gpu_share
from workers.loopback import (
    RENDEZVOUS_BACKEND,
    bound_store,
    loopback_interface,
    register_rendezvous,
)
from workers.outcome import RunnerReport
from workers.recipes import Recipe
from workers.stdio import prefix_stdio
from workers.training import Preempted, Reports, RunSpec
from workers.zygote import RANK_START_ENV

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Node:
    """This box's place in a job across boxes (picklable: every rank gets it)."""

    node: int  # 0 .. nodes-1, in the order the workers joined the gang
    nodes: int
    rendezvous: str  # node 0's address:port
    workers: tuple[str, ...]  # each node's worker, by node
    address: str  # the address this worker advertises
    timeout_s: float  # the rendezvous must complete within this
    socket_ifname: str | None = None  # GLOO/NCCL_SOCKET_IFNAME for the ranks

    @property
    def others(self) -> str:
        return ", ".join(f"node {n} ({w})" for n, w in enumerate(self.workers) if n != self.node)


class RendezvousFailed(RuntimeError):
    """The nodes did not all meet in time; the message names the ones awaited."""


def run(
    spec: RunSpec, node: Node, recipe: Recipe, params: BaseModel, reports: Reports | None
) -> RunnerReport:
    """Train this node's ranks; the report says whether global rank 0 was here."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import RendezvousError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from workers import strategies

    store = _rendezvous_store(node)
    register_rendezvous()
    start_method = os.environ.get(RANK_START_ENV, "spawn")
    loaded = (recipe, params) if start_method == "fork" else None
    config = LaunchConfig(
        min_nodes=node.nodes,
        max_nodes=node.nodes,
        nproc_per_node=spec.devices,
        run_id=f"trainyard-job-{spec.job_id}-attempt-{spec.attempt}",
        rdzv_backend=RENDEZVOUS_BACKEND,
        rdzv_endpoint=node.rendezvous,
        rdzv_configs={"store": store, "join_timeout": int(node.timeout_s)},
        local_addr=node.address,
        max_restarts=0,
        monitor_interval=0.2,
        start_method=start_method,
        logs_specs=DefaultLogsSpecs(log_dir=str(spec.files.torchrun_logs)),
    )
    os.environ.update(_socket_env(node))  # read by gloo and NCCL as the ranks start
    logging.getLogger("torch.distributed.elastic").setLevel(logging.WARNING)
    try:
        elastic_launch(config, entrypoint=_rank_main)(spec, node, loaded, reports)
    except RendezvousError as exc:
        raise RendezvousFailed(
            f"the rendezvous at {node.rendezvous} did not complete in {node.timeout_s:g}s: "
            f"waiting for {node.others} ({type(exc).__name__}: {exc})"
        ) from exc
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


def _rendezvous_store(node: Node) -> dist.TCPStore:
    """Node 0 serves the store on its advertised address; the others connect to it,
    waiting up to the rendezvous' limit for node 0 to come."""
    host, _, port = node.rendezvous.rpartition(":")
    host = host.strip("[]")
    if node.node == 0:
        return bound_store(host, int(port), None, node.timeout_s)
    try:
        return dist.TCPStore(
            host, int(port), None, is_master=False, timeout=timedelta(seconds=node.timeout_s)
        )
    except (RuntimeError, dist.DistStoreError) as exc:
        raise RendezvousFailed(
            f"node 0 ({node.workers[0]}) did not serve the rendezvous at {node.rendezvous} "
            f"within {node.timeout_s:g}s: {exc}"
        ) from exc


def _socket_env(node: Node) -> dict[str, str]:
    """The interface the ranks' gloo and NCCL sockets use (``SOCKET_IFNAME``)."""
    interface = node.socket_ifname
    if interface is None and _is_loopback(node.address):
        interface = loopback_interface()
    if interface is None:
        return {}
    return {"GLOO_SOCKET_IFNAME": interface, "NCCL_SOCKET_IFNAME": interface}


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return address == "localhost"


def _rank_main(
    spec: RunSpec,
    node: Node,
    loaded: tuple[Recipe, BaseModel] | None,
    reports: Reports | None,
) -> None:
    """One rank, as the elastic launch starts it (``RANK``, ``LOCAL_RANK``,
    ``WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT`` of the agent's store in its
    environment): join the global group and train as any DDP rank does."""
    from workers import strategies
    from workers.training import stop_on_sigterm

    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    prefix_stdio(f"[node {node.node} rank {rank}] ", spec.job_id)
    stop_on_sigterm()
    torch.set_num_threads(spec.threads)
    cuda = spec.accelerator == "cuda"
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
        gpu_share.cap_this_process(device)
    # NCCL's asynchronous error handling: a peer's failure aborts this rank's collective
    # instead of leaving it hanging until the timeout.
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    dist.init_process_group(
        "nccl" if cuda else "gloo",
        init_method="env://",
        timeout=timedelta(seconds=strategies.COLLECTIVE_TIMEOUT_S),
    )
    log.info(
        "rank %d of %d (node %d of %d) joined the %s group",
        rank,
        spec.world_size,
        node.node,
        node.nodes,
        dist.get_backend(),
    )
    strategies.train_in_group(rank, spec, loaded, reports, device)
