"""Small jobs sharing a big GPU: where a job that asks for part of one GPU
(``gpu_memory_gb``) goes, and how its allocator is held to what it asked.

A GPU is held whole by one job or shared by jobs that each asked for some GiB of it,
never both. A GPU's room for one more share is the smaller of what the shares already
there leave of its memory and what NVML says is free (other processes use GPUs too),
less one CUDA context (``service.jobspec.CUDA_CONTEXT_GB``), which each share brings
beside its allocator's memory. The claim is offered the largest room; a claimed share
goes where it fits best (the smallest room it fits), so idle GPUs stay whole for jobs
that need whole ones.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from service.jobspec import CUDA_CONTEXT_GB

GIB = 2**30
# torch's allocator setting that caps each process at a fraction of its GPU's memory: read
# by every process the job starts, scripts' torchrun ranks included.
ALLOC_CONF = "PYTORCH_CUDA_ALLOC_CONF"
FRACTION_KEY = "per_process_memory_fraction"


class Holding(NamedTuple):
    """What one running attempt holds: device indices, and its share (None: whole)."""

    devices: list[int]
    share_gb: float | None


class Offer(NamedTuple):
    """What a claim may take: GPUs (or CPU slots) no attempt holds, and each GPU's room
    for one more share (GiB), for GPUs not held whole."""

    whole: list[int]
    rooms: dict[int, float]

    @property
    def largest_room_gb(self) -> float:
        return max(self.rooms.values(), default=0.0)


def offer(
    devices: list[dict[str, Any]],
    holdings: Iterable[Holding],
    free_bytes: Mapping[int, int] | None = None,
    *,
    shareable: bool = True,
) -> Offer:
    """The free devices and the rooms, from the attempts' ``holdings`` and NVML's free
    memory by device index (``free_bytes``; absent: the bookkeeping alone decides).
    ``shareable``: the devices are GPUs (CPU slots are never shared)."""
    held_whole: set[int] = set()
    shared: dict[int, float] = defaultdict(float)
    for holding in holdings:
        if holding.share_gb is None:
            held_whole.update(holding.devices)
        else:
            for index in holding.devices:
                shared[index] += holding.share_gb + CUDA_CONTEXT_GB
    busy = held_whole | set(shared)
    whole = [d["index"] for d in devices if d["index"] not in busy]
    rooms: dict[int, float] = {}
    if shareable:
        for device in devices:
            index = device["index"]
            if index in held_whole:
                continue
            left = device["memory_mb"] / 1024 - shared[index]
            if free_bytes is not None and index in free_bytes:
                left = min(left, free_bytes[index] / GIB)
            rooms[index] = max(0.0, left - CUDA_CONTEXT_GB)
    return Offer(whole, rooms)


def place(rooms: Mapping[int, float], share_gb: float) -> int | None:
    """Best fit: the GPU with the smallest room that still holds the share; None if none."""
    fitting = [(room, index) for index, room in rooms.items() if room >= share_gb]
    return min(fitting)[1] if fitting else None


def fraction(share_gb: float, memory_mb: int) -> float:
    """The part of a GPU of ``memory_mb`` that a share of ``share_gb`` is."""
    return min(1.0, share_gb * 1024 / memory_mb)


def alloc_conf(existing: str | None, part: float) -> str:
    """``PYTORCH_CUDA_ALLOC_CONF`` capping the allocator at ``part`` of the GPU, keeping
    the worker's other allocator settings (its own cap gives way to the job's)."""
    kept = [
        item
        for item in (existing or "").split(",")
        if item.strip() and item.split(":")[0].strip() != FRACTION_KEY
    ]
    return ",".join([*kept, f"{FRACTION_KEY}:{part:.6f}"])


def fraction_in(conf: str | None) -> float | None:
    """The cap an ``alloc_conf`` value sets, or None."""
    for item in (conf or "").split(","):
        key, _, value = item.partition(":")
        if key.strip() == FRACTION_KEY:
            return float(value)
    return None
