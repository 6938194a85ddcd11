"""What this box can train on (CUDA GPUs, or CPU slots when it has none), and how the
supervisor hands those devices out."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from service.models import Accelerator
from workers import gpu

if TYPE_CHECKING:
    from workers.attempt import Attempt

# GPU utilisation and memory, for /metrics: NVML's init costs milliseconds, so not on
# every heartbeat.
GPU_SAMPLE_EVERY_S = 5.0


@dataclass
class Box:
    """This box's devices as the supervisor hands them out: which are free, their NVML
    samples, and when a finished attempt's GPUs may go to the next job."""

    accelerator: Accelerator
    devices: list[dict[str, Any]]
    # Which pids hold a CUDA context on some GPUs; replaceable in tests (no GPU there).
    gpu_pids: Callable[[list[int]], set[int] | None] = gpu.compute_pids
    _sampled_at: float = field(default=float("-inf"), repr=False)

    @classmethod
    def detect(cls, cpu_slots: int | None = None) -> Box:
        return cls(*detect(cpu_slots))

    def free(self, busy: Iterable[int]) -> list[int]:
        """Device indices no attempt holds, in order."""
        held = set(busy)
        return [d["index"] for d in self.devices if d["index"] not in held]

    def sample(self) -> list[dict[str, Any]] | None:
        """The GPUs' utilisation and memory, at most every GPU_SAMPLE_EVERY_S; else None."""
        now = time.monotonic()
        if self.accelerator != Accelerator.cuda or now - self._sampled_at < GPU_SAMPLE_EVERY_S:
            return None
        self._sampled_at = now
        return gpu.sample(self.devices)

    def released(self, attempt: Attempt, now: float, grace_s: float) -> bool:
        """On CUDA, an attempt's devices go to the next job only once NVML lists none of its
        processes on them (see ``Attempt.gpus_released``)."""
        if self.accelerator != Accelerator.cuda:
            return True
        return attempt.gpus_released(self.gpu_pids(attempt.devices), now, grace_s)


def detect(cpu_slots: int | None = None) -> tuple[Accelerator, list[dict[str, Any]]]:
    """(accelerator, devices): every visible GPU, else ``cpu_slots`` (default: core count)."""
    import torch  # here, not above: the worker starts its zygote before it pays for torch

    if torch.cuda.is_available():
        devices = []
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            devices.append(
                {
                    "index": i,
                    "kind": "cuda",
                    "name": props.name,
                    "memory_mb": props.total_memory // 2**20,
                }
            )
        return Accelerator.cuda, devices
    slots = cpu_slots or os.cpu_count() or 1
    return Accelerator.cpu, [
        {"index": i, "kind": "cpu", "name": f"cpu slot {i}"} for i in range(slots)
    ]
