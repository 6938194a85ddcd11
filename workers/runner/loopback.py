"""Loopback only: what a job's processes listen on while the job runs on one box.

A job's ranks all run on this box, so nothing they listen on needs another address. Left
to itself torch does otherwise: a ``TCPStore`` server binds every interface (``::``)
whatever host it is given, and gloo binds the address this box's hostname resolves to
(an interface on the network, unless that is loopback). Anyone who reaches the port can
then read or write the rendezvous' keys, or connect to a rank mid-collective.

So the rendezvous store is given a socket already bound to 127.0.0.1 (``master_listen_fd``,
torch's way in), and the ranks' gloo and NCCL sockets are pinned to the loopback interface
through ``GLOO_SOCKET_IFNAME`` and ``NCCL_SOCKET_IFNAME`` (``one_box_env``). A script's
elastic launch meets on such a store too (``RENDEZVOUS_BACKEND``): torch's own c10d
rendezvous would host two stores on every interface, its own and one for the ranks.
"""

from __future__ import annotations

import socket
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported by the callers, never by the supervisor
    import torch.distributed as dist
    from torch.distributed.elastic.rendezvous import RendezvousHandler, RendezvousParameters

LOOPBACK = "127.0.0.1"
# Linux's name for it; used when /sys does not say (IFF_LOOPBACK is bit 3 of its flags).
DEFAULT_LOOPBACK_INTERFACE = "lo"
IFF_LOOPBACK = 0x8
LISTEN_BACKLOG = 128  # pending connections: more than the ranks of any one box
# The elastic launch's rendezvous on a store the caller hosts: rdzv_configs={"store": ...}
RENDEZVOUS_BACKEND = "trainyard-loopback"


def loopback_store(world_size: int | None, timeout_s: float) -> dist.TCPStore:
    """A rendezvous store served on 127.0.0.1 only, on a port the kernel picks."""
    return bound_store(LOOPBACK, 0, world_size, timeout_s)  # port 0: no race for it


def bound_store(address: str, port: int, world_size: int | None, timeout_s: float) -> dist.TCPStore:
    """A rendezvous store served on ``address`` only (a job across boxes: the address its
    first node's worker advertises), on ``port`` (0: one the kernel picks)."""
    import torch.distributed as dist

    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    try:
        # a retried attempt may bind the port its last one used, still in TIME_WAIT
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((address, port))
        listener.listen(LISTEN_BACKLOG)
        port = listener.getsockname()[1]
        store = dist.TCPStore(
            address,
            port,
            world_size,
            is_master=True,
            wait_for_workers=False,
            timeout=timedelta(seconds=timeout_s),
            master_listen_fd=listener.fileno(),
        )
    except BaseException:
        listener.close()
        raise
    listener.detach()  # the store's server owns the socket now, and closes it
    return store


def loopback_interface() -> str:
    """The name of this box's loopback network interface ("lo" on Linux)."""
    for _index, name in socket.if_nameindex():
        try:
            flags = int((Path("/sys/class/net") / name / "flags").read_text(), 16)
        except (OSError, ValueError):
            continue
        if flags & IFF_LOOPBACK:
            return name
    return DEFAULT_LOOPBACK_INTERFACE


def one_box_env() -> dict[str, str]:
    """Variables that keep gloo's and NCCL's sockets on loopback: for ranks on one box."""
    interface = loopback_interface()
    return {"GLOO_SOCKET_IFNAME": interface, "NCCL_SOCKET_IFNAME": interface}


def register_rendezvous() -> None:
    """Make ``RENDEZVOUS_BACKEND`` known to the elastic launch (again: a no-op)."""
    from torch.distributed.elastic.rendezvous import rendezvous_handler_registry

    rendezvous_handler_registry.register(RENDEZVOUS_BACKEND, _rendezvous_handler)


def _rendezvous_handler(params: RendezvousParameters) -> RendezvousHandler:
    """torch's c10d rendezvous, all of it on the caller's loopback store."""
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import (
        C10dRendezvousBackend,
    )
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler

    class Backend(C10dRendezvousBackend):
        @property
        def name(self) -> str:  # the launch checks that the handler is the one it asked for
            return RENDEZVOUS_BACKEND

    from torch.distributed.elastic.rendezvous import RendezvousInfo
    from torch.distributed.elastic.rendezvous.api import RendezvousStoreInfo

    store = params.config["store"]
    handler = create_handler(store, Backend(store, params.run_id), params)
    # Every rank meets on this store, wherever torch's rendezvous puts rank 0: it would
    # name rank 0's node as the ranks' MASTER_ADDR, with this store's port.
    host, _, port = params.endpoint.rpartition(":")
    meet_here = RendezvousStoreInfo(host.strip("[]"), int(port))
    next_rendezvous = handler.next_rendezvous

    def rendezvous_here() -> RendezvousInfo:
        info = next_rendezvous()
        return RendezvousInfo(info.store, info.rank, info.world_size, meet_here)

    handler.next_rendezvous = rendezvous_here  # type: ignore[method-assign]
    # The first node's agent hosts a second store, for the ranks' own init_process_group
    # (they join it as clients: TORCHELASTIC_USE_AGENT_STORE), bound to every interface.
    # That store can be this one (the rank 0 agent's own, or a client of it elsewhere):
    # the ranks' keys live under their own prefix (/worker/attempt_N).
    handler._create_tcp_store_server = lambda _addr, _port: store  # type: ignore[method-assign,assignment]
    return handler
