"""Recipe jobs on a real GPU, through a real server and worker: single, dp and ddp (NCCL)
train to the same weights (and on CPU slots, gloo: the same test's CPU twin); a cancelled
job's GPU is free, by NVML's account, when the job says cancelled (its CPU twin, without
NVML: tests/e2e/test_jobs_end_to_end.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_chaos import job_weights
from tests.gpu.cuda import accelerators, gpu_uuids, needs_cuda
from tests.stack import Stack, running_stack, wait_for
from tests.workers.ranks.test_strategies import relative_difference
from workers import gpu
from workers.procfs import group_members

pytestmark = pytest.mark.slow

# The test_strategies spec, as a job: 3 epochs of 512 samples, seconds on a GPU.
SPEC: dict[str, Any] = {
    "recipe": "mlp-classifier",
    "devices": 1,
    "epochs": 3,
    "batch_size": 32,
    "lr": 0.01,
    "optimizer": "adamw",
    "seed": 7,
    "params": {"train_samples": 512, "val_samples": 128},
}
# Why the worker may have let a GPU go while NVML still listed the job on it.
RELEASED_ANYWAY = "releasing them anyway"


def cuda_worker(stack: Stack, **env: str) -> list[dict[str, Any]]:
    """Start a worker (``env`` added to the stack's) that must find the box's GPUs; its
    devices as it published them."""
    stack.start_worker(env=env)
    (worker,) = stack.http.get("/workers").json()
    assert worker["accelerator"] == "cuda", worker
    devices: list[dict[str, Any]] = worker["devices"]
    assert devices and all(d["physical_id"] in gpu_uuids() for d in devices), devices
    return devices


def worker_log(stack: Stack) -> str:
    return (stack.tmp / "worker-e2e.log").read_text()


@pytest.mark.parametrize("accelerator", accelerators())
def test_single_dp_and_ddp_jobs_train_to_the_same_weights(tmp_path: Path, accelerator: str) -> None:
    cuda = accelerator == "cuda"
    with running_stack(tmp_path) as stack:
        if cuda:
            cuda_worker(stack)
        else:
            stack.start_worker()
        spec = {**SPEC, "accelerator": accelerator}
        jobs = {s: stack.submit(**spec, strategy=s)["id"] for s in ("single", "dp", "ddp")}
        done = {s: stack.wait_status(i, {"succeeded", "failed"}, 300) for s, i in jobs.items()}
        for strategy, job in done.items():
            assert job["status"] == "succeeded", job
            env = job["environment"]
            assert env["spec"]["accelerator"] == accelerator, env["spec"]
            assert env["spec"]["strategy"] == strategy, env["spec"]
            if cuda:
                assert env["cuda"] and env["cudnn"] and env["nccl"], env
                assert env["gpus"] and len(env["gpus"]["gpus"]) == 1, env["gpus"]
            else:
                assert env["nccl"] is None and env["gpus"] is None, env
            assert job["result"]["val/accuracy"] > 0.5, job["result"]  # it learned
        logs = stack.http.get(f"/jobs/{jobs['ddp']}/logs").json()
        backend = "nccl" if cuda else "gloo"
        joined = f"rank 0 of 1 joined the {backend} group"
        assert any(joined in x["text"] for x in logs), [x["text"] for x in logs]
        weights = {s: job_weights(stack, i) for s, i in jobs.items()}
    assert relative_difference(weights["single"], weights["dp"]) < 1e-4
    assert relative_difference(weights["single"], weights["ddp"]) < 1e-4


@needs_cuda
def test_a_cancelled_ddp_job_has_left_its_gpu_when_it_says_cancelled(tmp_path: Path) -> None:
    """The worker records the end only once NVML lists no process of the job on its GPU
    (``Box.released``): a job that says cancelled holds no GPU memory any more."""
    with running_stack(tmp_path) as stack:
        (device, *_) = cuda_worker(stack)
        spec = {**SPEC, "accelerator": "cuda"}
        job = stack.submit(**spec, strategy="ddp", epochs=100_000)  # until cancelled
        wait_for(lambda: stack.job(job["id"])["progress"], 120, "training to start")
        pgid = stack.runner_pgid(job["id"])
        held = wait_for(
            lambda: (gpu.compute_pids([device["physical_id"]]) or set()) & set(group_members(pgid)),
            30,
            "NVML to list the job's rank on the GPU the worker handed it",
        )
        r = stack.http.post(f"/jobs/{job['id']}/cancel")
        assert r.status_code == 202, r.text
        done = stack.wait_status(job["id"], {"cancelled"}, 60)
        assert done["reason"]["code"] == "cancelled"
        assert group_members(pgid) == []
        assert not (gpu.compute_pids([device["physical_id"]]) or set()) & held
        assert RELEASED_ANYWAY not in worker_log(stack)  # released because NVML said so
        # and the GPU takes the next job
        nxt = stack.submit(**spec, strategy="single", epochs=1)
        assert stack.wait_status(nxt["id"], {"succeeded", "failed"}, 120)["status"] == "succeeded"
