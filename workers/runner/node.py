"""This box's place in a job across boxes, and how its ranks meet the other boxes'.

Each node's runner starts its ranks through PyTorch's elastic launch (the API torchrun
runs) with c10d's rendezvous: ``min_nodes = max_nodes = nodes``, no restarts (a failed
attempt is the supervisors' to retry, as one job), and a run id per attempt, so a rank
left over from an earlier attempt can never join this one. The rendezvous store is
served by node 0's runner on the address its worker advertises (``ADVERTISE_ADDRESS``),
on the port it chose when it joined the gang, and every rank's ``init_process_group``
meets on that same store (``workers.runner.loopback``'s handler): nothing else listens. Recipe
jobs (``workers.ranks.multinode``) and script jobs (``workers.script.launch``) launch the same
way, from ``launch_config``.

``RANK`` and ``WORLD_SIZE`` are global. torch's rendezvous orders the nodes, so global
rank 0 may be on any of them; that node is the job's *leader*: its rank 0 reports
progress and metrics and writes the final weights, and its runner's report ends the job.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from service.settings import is_loopback
from workers.errors import NotTheJobs
from workers.runner.loopback import (
    RENDEZVOUS_BACKEND,
    bound_store,
    loopback_interface,
    register_rendezvous,
)

if TYPE_CHECKING:  # torch is imported by the callers, never by the supervisor
    import torch.distributed as dist
    from torch.distributed.launcher.api import LaunchConfig


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

    def named(self, nodes: list[int]) -> str:
        """Nodes, in words: "node 1 (box-b)"."""
        return ", ".join(f"node {n} ({self.workers[n]})" for n in nodes)

    def socket_env(self) -> dict[str, str]:
        """The interface the ranks' gloo and NCCL sockets use (``SOCKET_IFNAME``; on a
        loopback address, loopback's), and NCCL's asynchronous error handling: a peer's
        failure aborts a collective instead of leaving it to its timeout."""
        env = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}
        interface = self.socket_ifname
        if interface is None and is_loopback(self.address):
            interface = loopback_interface()
        if interface is not None:
            env.update(GLOO_SOCKET_IFNAME=interface, NCCL_SOCKET_IFNAME=interface)
        return env


class RendezvousFailed(RuntimeError, NotTheJobs):
    """The nodes did not all meet in time; the message names the ones awaited (their
    boxes' failure, not the job's)."""


def launch_config(
    node: Node, *, ranks: int, run_id: str, start_method: str, logs_specs: Any
) -> LaunchConfig:
    """The elastic launch of this node's ``ranks``, meeting the other nodes."""
    from torch.distributed.launcher.api import LaunchConfig

    register_rendezvous()
    store = _rendezvous_store(node)
    # Each node says it came, under a key of its own: whom a rendezvous that does not
    # complete waited for is then known by name (torch's own state names addresses).
    store.set(_came(run_id, node.node), node.workers[node.node])
    return LaunchConfig(
        min_nodes=node.nodes,
        max_nodes=node.nodes,
        nproc_per_node=ranks,
        run_id=run_id,
        rdzv_backend=RENDEZVOUS_BACKEND,
        rdzv_endpoint=node.rendezvous,
        rdzv_configs={"store": store, "join_timeout": int(node.timeout_s)},
        local_addr=node.address,
        max_restarts=0,
        monitor_interval=0.2,
        start_method=start_method,
        logs_specs=logs_specs,
    )


def not_met(node: Node, config: LaunchConfig, exc: BaseException) -> RendezvousFailed:
    """The error of a rendezvous that did not complete: the nodes that never came."""
    store = config.rdzv_configs["store"]
    where = f"the rendezvous at {node.rendezvous}"
    try:
        missing = [n for n in range(node.nodes) if not store.check([_came(config.run_id, n)])]
    except Exception:  # node 0 stopped serving it (it gave up first, or died)
        return RendezvousFailed(
            f"{where} ended before it completed: {node.named([0])}, which served it, "
            f"stopped ({type(exc).__name__})"
        )
    return RendezvousFailed(
        f"{where} did not complete in {node.timeout_s:g}s: "
        f"{node.named(missing) or 'every node came'} never came ({type(exc).__name__})"
    )


def _came(run_id: str, node: int) -> str:
    return f"trainyard/{run_id}/node-{node}"


def _rendezvous_store(node: Node) -> dist.TCPStore:
    """Node 0 serves the store on its advertised address; the others connect to it,
    waiting up to the rendezvous' limit for node 0 to come."""
    import torch.distributed as dist

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
