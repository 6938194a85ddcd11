"""A stand-in for the pynvml module, for tests on boxes without a GPU: only the functions
``workers.gpu`` calls, on GPUs with made-up UUIDs, processes and memory. The real code
takes it through its ``nvml`` parameters; this is the one kind of fake the GPU tests
use (no GPU runs here), and ``make gpu-check`` runs the same code against real NVML."""

from __future__ import annotations

from dataclasses import dataclass, field

GIB = 2**30


@dataclass
class Process:
    pid: int
    usedGpuMemory: int | None = None  # NVML's name


@dataclass
class Memory:
    used: int
    total: int

    @property
    def free(self) -> int:
        return self.total - self.used


@dataclass
class Utilization:
    gpu: int


@dataclass
class StandInNvml:
    """GPUs in PCI order: GPU i has ``uuids[i]``, runs the pids ``running[i]`` (each
    using ``process_bytes[pid]``), and has ``used[i]`` bytes in use (default: its
    processes' sum) of ``total`` bytes."""

    uuids: list[str]
    running: dict[int, list[int]] = field(default_factory=dict)
    process_bytes: dict[int, int] = field(default_factory=dict)
    used: dict[int, int] = field(default_factory=dict)
    total: int = 80 * GIB
    asked: list[int] = field(default_factory=list)  # which GPUs' processes were listed

    def nvmlInit(self) -> None:  # NVML's names, from here on
        pass

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return len(self.uuids)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if not 0 <= index < len(self.uuids):
            raise ValueError(f"no GPU {index}")
        return index

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> int:
        return self.uuids.index(uuid)

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return self.uuids[handle]

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[Process]:
        self.asked.append(handle)
        pids = self.running.get(handle, [])
        return [Process(pid, self.process_bytes.get(pid)) for pid in pids]

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Memory:
        in_use = sum(self.process_bytes.get(p, 0) for p in self.running.get(handle, []))
        return Memory(used=self.used.get(handle, in_use), total=self.total)

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> Utilization:
        return Utilization(gpu=10 * handle)
