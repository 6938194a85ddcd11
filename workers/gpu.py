"""What NVML says about the GPUs: which processes hold a CUDA context on them."""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)


def compute_pids(indices: list[int]) -> set[int] | None:
    """PIDs with a CUDA context on these GPUs (NVML's PCI order); None without NVML."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no driver, no GPU: there is nothing NVML can tell
        return None
    try:
        pids: set[int] = set()
        for index in indices:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            pids.update(p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle))
        return pids
    except Exception:
        log.exception("NVML could not list the processes on GPUs %s", indices)
        return None
    finally:
        pynvml.nvmlShutdown()


def describe(indices: list[int]) -> dict[str, object] | None:
    """Driver version and GPU names of these devices; None without NVML."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return None
    try:
        names = [pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i)) for i in indices]
        return {"driver": pynvml.nvmlSystemGetDriverVersion(), "gpus": names}
    except Exception:
        log.exception("NVML could not describe GPUs %s", indices)
        return None
    finally:
        pynvml.nvmlShutdown()


def sample(devices: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """The devices with their current utilisation and memory in use; None without NVML."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return None
    try:
        sampled = []
        for device in devices:
            handle = pynvml.nvmlDeviceGetHandleByIndex(device["index"])
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            sampled.append(
                {
                    **device,
                    "utilization_percent": pynvml.nvmlDeviceGetUtilizationRates(handle).gpu,
                    "memory_used_bytes": memory.used,
                    "memory_total_bytes": memory.total,
                }
            )
        return sampled
    except Exception:
        log.exception("NVML could not sample the GPUs")
        return None
    finally:
        pynvml.nvmlShutdown()
