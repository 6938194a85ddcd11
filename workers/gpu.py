"""What NVML says about the GPUs: which processes hold a CUDA context on them."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")


def _ask_nvml(what: str, read: Callable[[Any], T]) -> T | None:
    """``read(pynvml)`` between NVML's init and shutdown; None without NVML (no driver, no
    GPU: there is nothing it can tell) or when the read fails (logged as ``what``)."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return None
    try:
        return read(pynvml)
    except Exception:
        log.exception("NVML could not %s", what)
        return None
    finally:
        pynvml.nvmlShutdown()


def compute_pids(indices: list[int]) -> set[int] | None:
    """PIDs with a CUDA context on these GPUs (NVML's PCI order); None without NVML."""

    def read(nvml: Any) -> set[int]:
        pids: set[int] = set()
        for index in indices:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            pids.update(p.pid for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle))
        return pids

    return _ask_nvml(f"list the processes on GPUs {indices}", read)


def describe(indices: list[int]) -> dict[str, object] | None:
    """Driver version and GPU names of these devices; None without NVML."""

    def read(nvml: Any) -> dict[str, object]:
        names = [nvml.nvmlDeviceGetName(nvml.nvmlDeviceGetHandleByIndex(i)) for i in indices]
        return {"driver": nvml.nvmlSystemGetDriverVersion(), "gpus": names}

    return _ask_nvml(f"describe GPUs {indices}", read)


def sample(devices: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """The devices with their current utilisation and memory in use; None without NVML."""

    def read(nvml: Any) -> list[dict[str, Any]]:
        sampled = []
        for device in devices:
            handle = nvml.nvmlDeviceGetHandleByIndex(device["index"])
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            sampled.append(
                {
                    **device,
                    "utilization_percent": nvml.nvmlDeviceGetUtilizationRates(handle).gpu,
                    "memory_used_bytes": memory.used,
                    "memory_total_bytes": memory.total,
                }
            )
        return sampled

    return _ask_nvml("sample the GPUs", read)
