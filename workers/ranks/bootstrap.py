"""A training process's start and end, in one place for every strategy (torchtitan keeps
one ``init_distributed``): its log prefix, SIGTERM as "checkpoint and stop", threads,
device, the GPU share's cap, and for DDP the socket interface, the backend, the process
group with a timeout, and a barrier before the group is destroyed.

The cap is given here, by the process that trains, from what the supervisor handed the
runner, before any of the job's code runs: the job's environment cannot lift it. (It can
still call ``torch.cuda.set_per_process_memory_fraction`` itself: a recipe is code, and
torch's allocator cap is a cooperative one; see docs/architecture.md, Memory and GPUs.)
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from service.models import Accelerator
from workers.ranks.training import RunSpec, stop_on_sigterm
from workers.stdio import prefix_stdio

log = logging.getLogger(__name__)

# Ranks must all join the process group within this; a rank that never comes fails the job.
INIT_TIMEOUT_S = 60.0
# Longest a collective may wait for a peer before the attempt fails (a hung or dead rank).
COLLECTIVE_TIMEOUT_S = 120.0


def start_rank(
    spec: RunSpec, *, label: str, local_rank: int, gpu_fraction: float | None
) -> torch.device:
    """Set up a rank's own process to train on its device; returns the device. ``label``
    prefixes its output lines (``[rank 1] ``); ``gpu_fraction``: the job's share of its
    GPU."""
    prefix_stdio(label, spec.job_id)
    stop_on_sigterm()
    return place(spec, local_rank=local_rank, gpu_fraction=gpu_fraction)


def place(spec: RunSpec, *, local_rank: int, gpu_fraction: float | None) -> torch.device:
    """This process's threads and device, and the share's cap (single and dp train in
    the runner's own process, which has its prefix and signals already)."""
    torch.set_num_threads(spec.threads)
    if spec.accelerator != Accelerator.cuda:
        return torch.device("cpu")
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
    if gpu_fraction is not None:
        torch.cuda.set_per_process_memory_fraction(gpu_fraction, device)
    return device


@contextmanager
def process_group(
    spec: RunSpec,
    device: torch.device,
    *,
    rank: int,
    socket_env: dict[str, str],
    store: dist.Store | None = None,
) -> Iterator[None]:
    """This rank in the job's group (on ``store``, else on the elastic launch's
    ``MASTER_ADDR``/``MASTER_PORT``), until the block ends; on a clean end every rank
    meets at a barrier before the group is destroyed."""
    # gloo and NCCL read their interfaces as the group starts: loopback on one box.
    os.environ.update(socket_env)
    init: dict[str, Any] = {"init_method": "env://"} if store is None else {"store": store}
    dist.init_process_group(
        "nccl" if device.type == "cuda" else "gloo",
        rank=rank,
        world_size=spec.world_size,
        timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S),
        **init,
    )
    log.info("rank %d of %d joined the %s group", rank, spec.world_size, dist.get_backend())
    clean = False
    try:
        yield
        # Every rank reaches this before any tears down: destroying the group while a
        # peer is still in a collective aborts gloo at exit (seen: ~1 run in 10).
        dist.barrier()
        clean = True
    finally:
        if clean:
            dist.destroy_process_group()
        sys.stdout.flush()
        sys.stderr.flush()


def leave() -> None:
    """Leave without the interpreter's teardown. Even after a barrier and a clean
    ``destroy_process_group()``, a gloo rank still aborted at exit once in CI ("terminate
    called without an active exception": a C++ thread destroyed while joinable during
    finalisation). Call it once everything the rank owes is done (its points appended,
    its result and checkpoints written, its output flushed)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
