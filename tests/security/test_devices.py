"""Careless neighbours: a worker confined to some GPUs must train on
those GPUs, and wait for those GPUs, not on the box's first ones.

A worker started with ``CUDA_VISIBLE_DEVICES=2,3`` sees them as torch devices 0 and 1.
Its runners must be handed the physical GPUs (by UUID), and the NVML release check must
watch GPUs 2 and 3, where the job's processes run.

No GPU runs here, so this is the one place a stand-in is right: the device list torch
would report and a small NVML (only the functions ``workers.gpu`` calls, on four GPUs
with made-up UUIDs and processes) are given to the real code through its parameters.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from functools import partial
from typing import Any

import pytest

from service.models import Accelerator, Strategy
from service.store import Claim, Fence
from tests.standin_nvml import GIB, StandInNvml
from workers import gpu
from workers.supervisor.attempt import Attempt
from workers.supervisor.devices import Box, gpu_devices

UUIDS = [f"GPU-0000000{i}-aaaa-bbbb-cccc-dddddddddddd" for i in range(4)]
JOB_PIDS = {301, 302}  # the attempt's processes, on physical GPUs 2 and 3
NEIGHBOUR_PIDS = {101, 102}  # another worker's job, on physical GPUs 0 and 1


def standin_nvml() -> StandInNvml:
    """NVML on four GPUs in PCI order: GPU i has UUIDS[i] and uses i GiB; 0 and 1 run a
    neighbour's job, 2 and 3 this attempt's ranks."""
    return StandInNvml(
        UUIDS,
        running={0: [101], 1: [102], 2: [301], 3: [302]},
        used={i: i * GIB for i in range(4)},
    )


class NoNvml:
    """NVML on a box without its library or driver: its init fails."""

    def nvmlInit(self) -> None:
        raise RuntimeError("NVML Shared Library Not Found")


def found(count: int) -> list[dict[str, Any]]:
    """The device list torch reports for a worker that sees ``count`` GPUs."""
    return [
        {"index": i, "kind": "cuda", "name": "Stand-in GPU", "memory_mb": 81559}
        for i in range(count)
    ]


@pytest.fixture
def attempt() -> Iterator[Attempt]:
    """An attempt on the worker's devices 0 and 1 whose processes were JOB_PIDS."""
    proc = subprocess.Popen(["true"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    claim = Claim(Fence(1, 1, "token"), devices=2, strategy=Strategy.ddp, timeout_s=None)
    made = Attempt(claim, [0, 1], proc, proc.stdout, proc.stderr)
    made.pids_seen.update(JOB_PIDS)
    yield made
    proc.wait()


@pytest.mark.parametrize("visible", ["2,3", f"{UUIDS[2]},{UUIDS[3]}", "GPU-00000002,GPU-00000003"])
def test_a_worker_confined_to_gpus_2_and_3_hands_out_and_watches_gpus_2_and_3(
    visible: str, attempt: Attempt
) -> None:
    """Indices, full UUIDs and UUID prefixes (CUDA accepts each) name the same GPUs."""
    nvml = standin_nvml()
    devices = gpu_devices(found(2), visible, nvml=nvml)
    box = Box(Accelerator.cuda, devices, gpu_pids=partial(gpu.compute_pids, nvml=nvml))
    assert box.physical([0, 1]) == [UUIDS[2], UUIDS[3]]  # the runner's CUDA_VISIBLE_DEVICES
    assert box.physical([1]) == [UUIDS[3]]
    # The job's processes still hold GPUs 2 and 3: they are not released yet ...
    assert not box.released(attempt, now=10.0, grace_s=5)
    assert sorted(set(nvml.asked)) == [2, 3]  # ... and GPUs 0 and 1 were never asked
    # ... and once they are gone, they are, whatever runs on GPUs 0 and 1.
    nvml.running = {**nvml.running, 2: [], 3: []}
    assert box.released(attempt, now=11.0, grace_s=5)


def test_the_samples_are_of_the_workers_own_gpus() -> None:
    nvml = standin_nvml()
    sampled = gpu.sample(gpu_devices(found(2), "2,3", nvml=nvml), nvml=nvml)
    assert sampled is not None
    assert [(d["index"], d["memory_used_bytes"] // 2**30) for d in sampled] == [(0, 2), (1, 3)]
    assert [d["utilization_percent"] for d in sampled] == [20, 30]


def test_a_worker_with_every_gpu_hands_out_each_by_its_own_uuid(attempt: Attempt) -> None:
    """CUDA_VISIBLE_DEVICES unset: the worker's device i is the box's GPU i (PCI order)."""
    nvml = standin_nvml()
    box = Box(Accelerator.cuda, gpu_devices(found(4), None, nvml=nvml))
    assert box.physical([0, 1, 2, 3]) == UUIDS
    assert box.physical([2, 3]) == [UUIDS[2], UUIDS[3]]


def test_a_worker_that_sees_no_gpu_has_no_cuda_devices() -> None:
    """CUDA_VISIBLE_DEVICES empty: torch sees none, and nothing is made up."""
    assert gpu_devices(found(0), "", nvml=standin_nvml()) == []


def test_without_nvml_runners_get_the_workers_own_names_for_its_gpus() -> None:
    """No NVML to ask: the worker's own entries (a nested CUDA_VISIBLE_DEVICES means the
    same GPUs to the runner, which inherits CUDA_DEVICE_ORDER)."""
    devices = gpu_devices(found(2), "2,3", nvml=NoNvml())
    assert Box(Accelerator.cuda, devices).physical([0, 1]) == ["2", "3"]
    devices = gpu_devices(found(2), f"{UUIDS[2]}, {UUIDS[3]}", nvml=NoNvml())
    assert Box(Accelerator.cuda, devices).physical([1]) == [UUIDS[3]]


def test_a_cpu_box_hands_out_no_gpus() -> None:
    box = Box(Accelerator.cpu, [{"index": 0, "kind": "cpu"}, {"index": 1, "kind": "cpu"}])
    assert box.physical([0, 1]) == []
