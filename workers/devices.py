"""What this box can train on: CUDA GPUs, or CPU slots when it has none."""

from __future__ import annotations

import os
from typing import Any


def detect(cpu_slots: int | None = None) -> tuple[str, list[dict[str, Any]]]:
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
        return "cuda", devices
    slots = cpu_slots or os.cpu_count() or 1
    return "cpu", [{"index": i, "kind": "cpu", "name": f"cpu slot {i}"} for i in range(slots)]
