"""A GPU goes to the next job only once NVML lists no process of the last one on it.

There is no GPU here: NVML's answer is given by a function, the decision is the real one.
"""

from __future__ import annotations

from types import SimpleNamespace

from service.settings import Settings
from workers import gpu
from workers.supervisor import Supervisor


def test_nvml_without_a_gpu_says_nothing() -> None:
    assert gpu.compute_pids([0]) is None


def test_devices_wait_while_nvml_lists_a_process_of_the_job(settings: Settings) -> None:
    no_zygote = settings.model_copy(update={"warm_start": False})  # this test runs no job
    sup = Supervisor(no_zygote, worker_id="w", kill_grace_s=5)
    sup.accelerator = "cuda"
    attempt = SimpleNamespace(job_id=1, devices=[0, 1], pids_seen={101, 102}, gpu_wait_since=None)
    listed = {101, 999}  # 101 is the job's; 999 belongs to someone else
    sup.gpu_pids = lambda devices: listed
    assert not sup._gpus_released(attempt, now=100.0)  # type: ignore[arg-type]
    assert not sup._gpus_released(attempt, now=104.0)  # type: ignore[arg-type]
    listed = {999}  # the context is gone: only another user's process remains
    assert sup._gpus_released(attempt, now=104.5)  # type: ignore[arg-type]
    stuck = SimpleNamespace(job_id=2, devices=[0], pids_seen={7}, gpu_wait_since=None)
    sup.gpu_pids = lambda devices: {7}
    assert not sup._gpus_released(stuck, now=200.0)  # type: ignore[arg-type]
    assert sup._gpus_released(stuck, now=205.0)  # type: ignore[arg-type]  # never forever
    sup.engine.dispose()
