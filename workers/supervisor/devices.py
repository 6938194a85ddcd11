"""What this box can train on (CUDA GPUs, or CPU slots when it has none), and how the
supervisor hands those devices out."""

from __future__ import annotations

import logging
import os
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from service import jobspec
from service.models import Accelerator
from workers import gpu
from workers.supervisor import gpu_share
from workers.supervisor import memory as memory_limit

if TYPE_CHECKING:
    from workers.supervisor.attempt import Attempt

log = logging.getLogger(__name__)

# GPU utilisation and memory, for /metrics: NVML's init costs milliseconds, so not on
# every heartbeat.
GPU_SAMPLE_EVERY_S = 5.0
# The GPUs' free memory, for placing shares of a GPU: read at most this often (an idle
# worker looks for a job every 50 ms). A share started since is in the bookkeeping.
GPU_FREE_EVERY_S = 1.0


@dataclass
class Box:
    """This box's devices as the supervisor hands them out: which are free, their physical
    ids and NVML samples, when a finished attempt's GPUs may go to the next job, and a
    job's memory budget on CPU slots, and where shares of a GPU fit."""

    accelerator: Accelerator
    devices: list[dict[str, Any]]
    # Which pids hold a CUDA context on some GPUs (by physical id); replaceable in tests.
    gpu_pids: Callable[[list[str]], set[int] | None] = gpu.compute_pids
    nvml: Any = None  # the pynvml module (None: import it); a stand-in in tests
    _sampled_at: float = field(default=float("-inf"), repr=False)
    _free_read_at: float = field(default=float("-inf"), repr=False)
    _free_bytes: dict[int, int] | None = field(default=None, repr=False)

    @classmethod
    def detect(cls, cpu_slots: int | None, memory_fraction: float) -> Box:
        return cls(*detect(cpu_slots, memory_fraction))

    def offer(self, holdings: Iterable[gpu_share.Holding]) -> gpu_share.Offer:
        """What a claim may take, given what the running attempts hold: the devices no
        attempt holds, and on a box with GPUs each one's room for a share."""
        cuda = self.accelerator == Accelerator.cuda
        return gpu_share.offer(
            self.devices, holdings, self._free_memory() if cuda else None, shareable=cuda
        )

    def largest_share_gb(self) -> float:
        """The most GiB a job asking for part of a GPU could ever get here (0: no GPUs)."""
        if self.accelerator != Accelerator.cuda:
            return 0.0
        return jobspec.largest_share_gb(self.devices)

    def memory_mb(self, index: int) -> int:
        return next(int(d["memory_mb"]) for d in self.devices if d["index"] == index)

    def _free_memory(self) -> dict[int, int] | None:
        """NVML's free bytes by device index, read at most every GPU_FREE_EVERY_S."""
        now = time.monotonic()
        if now - self._free_read_at >= GPU_FREE_EVERY_S:
            self._free_read_at = now
            ids = [d["physical_id"] for d in self.devices]
            read = gpu.free_memory(ids, self.nvml)
            indices = [d["index"] for d in self.devices]
            self._free_bytes = None if read is None else dict(zip(indices, read, strict=True))
        return self._free_bytes

    def physical(self, indices: Iterable[int]) -> list[str]:
        """The physical ids (see ``gpu_devices``) of these devices, for a runner's
        ``CUDA_VISIBLE_DEVICES`` and NVML; none on a box without GPUs."""
        if self.accelerator != Accelerator.cuda:
            return []
        by_index = {d["index"]: d["physical_id"] for d in self.devices}
        return [by_index[i] for i in indices]

    def memory_limit(self, indices: Iterable[int], processes: int) -> int | None:
        """Bytes each of a job's processes may hold, on these devices (see
        ``workers.supervisor.memory``); None on a box with GPUs."""
        if self.accelerator != Accelerator.cpu:
            return None
        held = set(indices)
        slots_mb = [d["memory_mb"] for d in self.devices if d["index"] in held]
        return memory_limit.process_limit_bytes(slots_mb, processes)

    def sample(self, jobs_by_pid: Mapping[int, int]) -> list[dict[str, Any]] | None:
        """The GPUs' utilisation and memory, with the memory each job's processes use
        there (``job_memory_bytes``, job id -> bytes; ``jobs_by_pid``: the pids of the
        running attempts), at most every GPU_SAMPLE_EVERY_S; else None."""
        now = time.monotonic()
        if self.accelerator != Accelerator.cuda or now - self._sampled_at < GPU_SAMPLE_EVERY_S:
            return None
        self._sampled_at = now
        sampled = gpu.sample(self.devices, self.nvml)
        if sampled is None:
            return None
        for device in sampled:
            by_job: dict[str, int] = defaultdict(int)
            for pid, used in device.pop("process_memory_bytes").items():
                if pid in jobs_by_pid:  # JSON's keys are text: the job id as text
                    by_job[str(jobs_by_pid[pid])] += used
            device["job_memory_bytes"] = dict(by_job)
        return sampled

    def released(self, attempt: Attempt, now: float, grace_s: float) -> bool:
        """On CUDA, an attempt's devices go to the next job only once NVML lists none of its
        processes on them (see ``Attempt.gpus_released``)."""
        if self.accelerator != Accelerator.cuda:
            return True
        listed = self.gpu_pids(self.physical(attempt.devices))
        return attempt.gpus_released(listed, now, grace_s)


def detect(
    cpu_slots: int | None, memory_fraction: float
) -> tuple[Accelerator, list[dict[str, Any]]]:
    """(accelerator, devices): every visible GPU, else ``cpu_slots`` (default: core count),
    each with its part of ``memory_fraction`` of the box's memory (a job's budget)."""
    import torch  # here, not above: the worker starts its zygote before it pays for torch

    if torch.cuda.is_available():
        found = []
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            found.append(
                {
                    "index": i,
                    "kind": "cuda",
                    "name": props.name,
                    "memory_mb": props.total_memory // 2**20,
                }
            )
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        pci_order = os.environ.get("CUDA_DEVICE_ORDER", "FASTEST_FIRST") == "PCI_BUS_ID"
        return Accelerator.cuda, gpu_devices(found, visible, pci_order=pci_order)
    slots = cpu_slots or os.cpu_count() or 1
    slot_mb = memory_limit.slot_memory_mb(memory_fraction, slots)
    return Accelerator.cpu, [
        {"index": i, "kind": "cpu", "name": f"cpu slot {i}", "memory_mb": slot_mb}
        for i in range(slots)
    ]


def gpu_devices(
    found: list[dict[str, Any]], visible: str | None, *, pci_order: bool = True, nvml: Any = None
) -> list[dict[str, Any]]:
    """The GPUs torch ``found`` (indexed within this worker's ``CUDA_VISIBLE_DEVICES``,
    ``visible``), each with its ``physical_id``: its UUID, or where NVML cannot tell it,
    the worker's own entry for it (which means the same GPU to a runner, as it inherits
    ``CUDA_DEVICE_ORDER``). The one place a worker's index becomes a physical GPU.

    ``pci_order``: CUDA numbers GPUs as NVML does (``CUDA_DEVICE_ORDER=PCI_BUS_ID``), so
    an index entry may be looked up in NVML. ``nvml`` stands in for pynvml in tests."""
    if visible is None:  # every GPU, numbered as CUDA numbers them
        entries = [str(i) for i in range(len(found))]
    else:  # CUDA's reading: comma-separated indices or UUIDs (or UUID prefixes)
        entries = [e.strip() for e in visible.split(",")][: len(found)]
    if len(entries) < len(found):
        raise RuntimeError(f"torch sees {len(found)} GPUs, CUDA_VISIBLE_DEVICES={visible!r}")
    ids = None
    if pci_order or not any(e.isdigit() for e in entries):
        ids = gpu.uuids(entries, nvml)
    else:
        log.warning(
            "CUDA_DEVICE_ORDER is not PCI_BUS_ID: GPUs %s are handed out by index, "
            "and NVML (which counts in PCI order) is not asked which they are",
            entries,
        )
    return [{**d, "physical_id": i} for d, i in zip(found, ids or entries, strict=True)]
