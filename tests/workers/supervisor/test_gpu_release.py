"""A GPU goes to the next job only once NVML lists no process of the last one on it.

Without a GPU, NVML's answer is given by the test and the decision is the real one; on a
box with one, NVML itself is asked about a child that holds a CUDA context.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from service.models import Accelerator, Strategy
from service.store import Claim, Fence
from tests.stack import wait_for
from workers import gpu
from workers.supervisor.attempt import Attempt
from workers.supervisor.devices import Box
from workers.supervisor.gpu_share import Holding


def _gpus() -> int:
    """How many GPUs NVML sees (0 without a driver); torch here may be a CPU build."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return 0
    try:
        return int(pynvml.nvmlDeviceGetCount())
    finally:
        pynvml.nvmlShutdown()


@pytest.fixture
def attempt() -> Iterator[Attempt]:
    """An attempt whose runner has already exited (``true``): only its bookkeeping is used."""
    proc = subprocess.Popen(["true"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    claim = Claim(Fence(1, 1, "token"), devices=2, strategy=Strategy.ddp, timeout_s=None)
    yield Attempt(claim, [0, 1], proc, proc.stdout, proc.stderr)
    proc.wait()


def test_nvml_without_a_gpu_says_nothing() -> None:
    if _gpus():
        pytest.skip("a GPU is present: NVML has something to say here")
    assert gpu.compute_pids(["0"]) is None


def test_devices_wait_while_nvml_lists_a_process_of_the_job(attempt: Attempt) -> None:
    attempt.pids_seen.update({101, 102})  # as alive() saw them while the job ran
    listed = {101, 999}  # 101 is the job's; 999 belongs to someone else
    assert not attempt.gpus_released(listed, now=100.0, grace_s=5)
    assert not attempt.gpus_released(listed, now=104.0, grace_s=5)
    listed = {999}  # the context is gone: only another user's process remains
    assert attempt.gpus_released(listed, now=104.5, grace_s=5)
    assert attempt.gpus_released(None, now=104.5, grace_s=5)  # no NVML: nothing to wait for


def test_devices_are_released_after_the_grace_even_if_nvml_still_lists_the_job(
    attempt: Attempt,
) -> None:
    attempt.pids_seen.add(7)
    assert not attempt.gpus_released({7}, now=200.0, grace_s=5)
    assert attempt.gpus_released({7}, now=205.0, grace_s=5)  # never forever


def test_the_box_asks_nvml_about_the_attempts_gpus_only_on_cuda(attempt: Attempt) -> None:
    asked: list[list[str]] = []

    def nvml_lists(physical_ids: list[str]) -> set[int]:
        asked.append(physical_ids)
        return {7}

    attempt.pids_seen.add(7)
    gpus = [
        {"index": i, "physical_id": f"GPU-{i}", "memory_mb": 81920, "kind": "cuda"}
        for i in range(2)
    ]
    cuda = Box(Accelerator.cuda, gpus, gpu_pids=nvml_lists)
    assert not cuda.released(attempt, now=10.0, grace_s=5)
    assert asked == [["GPU-0", "GPU-1"]]  # the attempt's own devices, by physical id
    cpu = Box(Accelerator.cpu, [{"index": 0}, {"index": 1}], gpu_pids=nvml_lists)
    assert cpu.released(attempt, now=10.0, grace_s=5) and len(asked) == 1
    assert cuda.offer([Holding([1], None)]).whole == [0]


# A CUDA context through the driver API itself, so a CPU build of torch does not matter.
HOLD_A_CONTEXT = """
import ctypes, sys
cuda = ctypes.CDLL("libcuda.so.1")
device, context = ctypes.c_int(), ctypes.c_void_p()
assert cuda.cuInit(0) == 0
assert cuda.cuDeviceGet(ctypes.byref(device), 0) == 0
assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device) == 0
assert cuda.cuCtxSetCurrent(context) == 0
print("ready", flush=True)
sys.stdin.read()
"""


@pytest.mark.gpu
@pytest.mark.skipif(not _gpus(), reason="needs a CUDA GPU")
def test_nvml_lists_a_child_that_holds_a_cuda_context() -> None:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    child = subprocess.Popen(
        [sys.executable, "-c", HOLD_A_CONTEXT],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
    )
    assert child.stdin is not None and child.stdout is not None
    try:
        assert child.stdout.readline() == b"ready\n"
        pids = wait_for(lambda: gpu.compute_pids(["0"]), 10, "NVML to list a process")
        assert child.pid in pids, pids
    finally:
        child.stdin.close()
        child.wait(timeout=30)
    wait_for(lambda: child.pid not in (gpu.compute_pids(["0"]) or set()), 10, "the context to go")
