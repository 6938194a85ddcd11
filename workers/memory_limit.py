"""A job's memory budget on a CPU box, so that a job asking for too much fails alone
(``out_of_memory``) rather than the kernel killing whichever process it picks (the API's,
say).

The budget: ``JOB_MEMORY_FRACTION`` of the box's MemTotal, split evenly over its device
slots; a job gets its slots' part, shared by its processes (one per rank for ddp). Each
process gets its part as ``RLIMIT_DATA``, set by the runner as it starts (its ranks and
loader workers inherit it): an allocation past it fails in the process that asked
(torch raises "DefaultCPUAllocator: can't allocate memory"), which the runner reports.

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

import errno
import logging
import re
import resource
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


def apply(limit_bytes: int) -> None:
    """Limit this process (and every process it starts) to ``limit_bytes`` of data:
    heap and private writable mappings, what a tensor's storage is."""
    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    if hard != resource.RLIM_INFINITY:
        limit_bytes = min(limit_bytes, hard)  # an unprivileged process cannot raise it
    resource.setrlimit(resource.RLIMIT_DATA, (limit_bytes, limit_bytes))
    log.info("memory limit: %d MiB of data per process", limit_bytes // 2**20)


# A refused allocation, as it reads in an exception's text: torch's CPU allocator past
# the limit, CUDA's caching allocator past the GPU's memory, Python's own MemoryError.
_REFUSED = re.compile(r"\bMemoryError\b|can't allocate memory|CUDA out of memory")


def ran_out(exc: BaseException) -> bool:
    """Whether a failure is an allocation that was refused: the same spec would run out
    again. torch has no type for it on the CPU: its allocator raises RuntimeError."""
    if isinstance(exc, MemoryError):
        return True
    if isinstance(exc, OSError) and exc.errno == errno.ENOMEM:
        return True
    return isinstance(exc, RuntimeError) and _REFUSED.search(str(exc)) is not None


def ran_out_in(stderr_tail: list[str]) -> bool:
    """Whether a program's last words on stderr are a refused allocation: a script's
    exception is not ours to inspect, only the last lines of its traceback (which, for
    DDP ranks, carry a "[rank N] " prefix)."""
    last = [line for line in stderr_tail if line.strip()][-3:]
    return any(_REFUSED.search(line) for line in last)
