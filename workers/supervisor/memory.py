"""A job's memory budget on a CPU box, so that a job asking for too much fails alone
(``out_of_memory``) rather than the kernel killing whichever process it picks (the API's,
say).

The budget: ``JOB_MEMORY_FRACTION`` of the box's MemTotal, split evenly over its device
slots; a job gets its slots' part, shared by its processes (one per rank for ddp). Each
process gets its part as ``RLIMIT_DATA``, set by the runner as it starts (its ranks and
loader workers inherit it: ``workers.runner.limits``): an allocation past it fails in the
process that asked (torch raises "DefaultCPUAllocator: can't allocate memory"), which the
runner reports (``workers.errors.ran_out``).

Why ``RLIMIT_DATA`` and not ``RLIMIT_AS``: torch reserves address space it never uses.
Measured here (torch 2.13 CPU, 2 threads, a gloo DDP step and a DataLoader): VmSize 624
MiB after ``import torch`` and 1007 MiB after the step, against VmData 216 and 340 MiB and
RSS 349 MiB; under ``RLIMIT_AS`` of 600 MiB the step could not even start its threads,
while ``RLIMIT_DATA`` of 600 MiB trained and refused a 1 GiB tensor.

A limit is per process: VmData counts pages shared with the zygote (torch's, ~220 MiB)
in every process, so a process gets at least ``MIN_PROCESS_BYTES``. GPU boxes get no limit
here: a GPU job's data is the GPU's.
"""

from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger(__name__)

MEMINFO = Path("/proc/meminfo")
# Less than this and torch cannot run a step (VmData 340 MiB above): a box with many
# slots and little memory gives each process this much rather than a limit nothing fits.
MIN_PROCESS_BYTES = 512 * 2**20


def box_memory_bytes(meminfo: Path = MEMINFO) -> int:
    """The box's MemTotal."""
    for line in meminfo.read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024  # stated in kB
    raise RuntimeError(f"{meminfo} has no MemTotal")


def slot_memory_mb(fraction: float, slots: int, total_bytes: int | None = None) -> int:
    """Each device slot's part of the memory jobs may use (what a worker publishes)."""
    total = box_memory_bytes() if total_bytes is None else total_bytes
    return int(total * fraction / slots) // 2**20


def process_limit_bytes(slots_mb: list[int], processes: int) -> int:
    """Each process's part of a job holding slots of these sizes."""
    share = sum(slots_mb) * 2**20 // max(processes, 1)
    return max(share, MIN_PROCESS_BYTES)
