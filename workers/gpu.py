"""What NVML says about the GPUs: their UUIDs, and which processes hold a CUDA context.

A GPU is named here by its physical id: its UUID (``GPU-…``), or, where NVML could not
tell one, its box-wide index as text. Never by a worker's torch index, which counts only
the GPUs in the worker's own ``CUDA_VISIBLE_DEVICES``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")


def _ask_nvml(what: str, read: Callable[[Any], T], nvml: Any = None) -> T | None:
    """``read(pynvml)`` between NVML's init and shutdown; None without NVML (no driver, no
    GPU: there is nothing it can tell) or when the read fails (logged as ``what``).
    ``nvml`` stands in for the pynvml module (tests on a box without a GPU)."""
    try:
        if nvml is None:
            import pynvml

            nvml = pynvml
        nvml.nvmlInit()
    except Exception:
        return None
    try:
        return read(nvml)
    except Exception:
        log.exception("NVML could not %s", what)
        return None
    finally:
        nvml.nvmlShutdown()


def _text(value: str | bytes) -> str:
    """pynvml returns bytes in older releases, str in newer ones."""
    return value.decode() if isinstance(value, bytes) else value


def _handle(nvml: Any, physical_id: str) -> Any:
    """NVML's handle of a GPU named by its UUID or its box-wide (PCI order) index."""
    if physical_id.isdigit():
        return nvml.nvmlDeviceGetHandleByIndex(int(physical_id))
    return nvml.nvmlDeviceGetHandleByUUID(physical_id)


def uuids(entries: list[str], nvml: Any = None) -> list[str] | None:
    """The full UUID of each ``CUDA_VISIBLE_DEVICES`` entry (a PCI-order index, a UUID
    or a unique UUID prefix, as CUDA reads them); None without NVML or if one is not
    found (MIG instances, say: NVML lists them under their parent)."""

    def read(nvml: Any) -> list[str]:
        every = [
            _text(nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(i)))
            for i in range(nvml.nvmlDeviceGetCount())
        ]
        found = []
        for entry in entries:
            if entry.isdigit():
                found.append(every[int(entry)])
                continue
            matches = [u for u in every if u.startswith(entry)]
            if len(matches) != 1:
                raise LookupError(f"no single GPU has a UUID starting {entry!r}")
            found.append(matches[0])
        return found

    return _ask_nvml(f"find the UUIDs of GPUs {entries}", read, nvml)


def compute_pids(physical_ids: list[str], nvml: Any = None) -> set[int] | None:
    """PIDs with a CUDA context on these GPUs; None without NVML."""

    def read(nvml: Any) -> set[int]:
        pids: set[int] = set()
        for physical_id in physical_ids:
            processes = nvml.nvmlDeviceGetComputeRunningProcesses(_handle(nvml, physical_id))
            pids.update(p.pid for p in processes)
        return pids

    return _ask_nvml(f"list the processes on GPUs {physical_ids}", read, nvml)


def describe(physical_ids: list[str]) -> dict[str, object] | None:
    """Driver version and GPU names of these devices; None without NVML."""

    def read(nvml: Any) -> dict[str, object]:
        names = [nvml.nvmlDeviceGetName(_handle(nvml, i)) for i in physical_ids]
        return {"driver": nvml.nvmlSystemGetDriverVersion(), "gpus": names}

    return _ask_nvml(f"describe GPUs {physical_ids}", read)


def free_memory(physical_ids: list[str], nvml: Any = None) -> list[int] | None:
    """Bytes of memory free on each of these GPUs; None without NVML."""

    def read(nvml: Any) -> list[int]:
        return [int(nvml.nvmlDeviceGetMemoryInfo(_handle(nvml, i)).free) for i in physical_ids]

    return _ask_nvml(f"read the free memory of GPUs {physical_ids}", read, nvml)


def sample(devices: list[dict[str, Any]], nvml: Any = None) -> list[dict[str, Any]] | None:
    """The devices with their current utilisation, memory in use, and the memory each
    process with a CUDA context there uses (``process_memory_bytes``, pid -> bytes; a
    driver that cannot tell says None, counted as 0); None without NVML."""

    def read(nvml: Any) -> list[dict[str, Any]]:
        sampled = []
        for device in devices:
            handle = _handle(nvml, device["physical_id"])
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            processes = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
            sampled.append(
                {
                    **device,
                    "utilization_percent": nvml.nvmlDeviceGetUtilizationRates(handle).gpu,
                    "memory_used_bytes": memory.used,
                    "memory_total_bytes": memory.total,
                    "process_memory_bytes": {p.pid: p.usedGpuMemory or 0 for p in processes},
                }
            )
        return sampled

    return _ask_nvml("sample the GPUs", read, nvml)
