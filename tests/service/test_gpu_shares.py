"""Small jobs sharing a big GPU, as the service sees them: the spec's
rules, the submit check against the workers' GPUs, the claim (one statement, on both
databases) that never mixes shares and whole GPUs, and what a waiting share says."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from service import store
from service.catalog import register_worker
from service.models import JobCreate, JobStatus, Worker
from service.store import Claim
from tests.conftest import RECIPES_DIR

H200_MB = 143_771  # what torch reports for an H200: 140.4 GiB
SPEC = {"recipe": "mlp-regression", "devices": 1}
# A CUDA worker with two idle H200s, as the supervisor offers them to a claim.
CLAIM: dict[str, Any] = {
    "worker_id": "gpubox",
    "accelerator": "cuda",
    "recipes": ["mlp-regression"],
    "lease_s": 30.0,
    "free_devices": 2,
    "total_devices": 2,
    "gpu_room_gb": 139.9,
    "gpu_total_gb": 139.9,
}


def gpu_worker(engine: Engine, worker_id: str = "gpubox", gpus: int = 2) -> None:
    from workers.recipes import load_recipes

    devices = [
        {"index": i, "kind": "cuda", "name": "H200", "memory_mb": H200_MB} for i in range(gpus)
    ]
    recipes = [r.describe() for r in load_recipes(RECIPES_DIR).values()]
    register_worker(
        engine,
        Worker(id=worker_id, hostname="gpubox", pid=1, accelerator="cuda", devices=devices,
               recipes=recipes),
    )  # fmt: skip


def enqueue(engine: Engine, **spec: Any) -> int:
    job, _ = store.create_job(engine, JobCreate(**{**SPEC, **spec}))
    assert job.id is not None
    return job.id


def claim(engine: Engine, **offer: Any) -> Claim | None:
    return store.claim_job(engine, **{**CLAIM, **offer})


@pytest.mark.parametrize(
    ("spec", "field", "words"),
    [
        ({"devices": 2, "strategy": "ddp", "batch_size": 64}, "devices", "part of one GPU"),
        ({"accelerator": "cpu"}, "accelerator", "use cuda or auto"),
        ({"gpu_memory_gb": 0}, "gpu_memory_gb", "greater than 0"),
        ({"gpu_memory_gb": 200}, "gpu_memory_gb", "the most any worker's GPU holds"),
    ],
)
def test_a_share_the_gpus_cannot_hold_is_refused_at_submit(
    client: TestClient, engine: Engine, spec: dict[str, Any], field: str, words: str
) -> None:
    gpu_worker(engine)
    r = client.post("/api/v1/jobs", json={**SPEC, "gpu_memory_gb": 8, **spec})
    assert r.status_code == 422, r.text
    errors = r.json()["detail"]
    assert any(e["loc"][-1] == field and words in e["msg"] for e in errors), errors


def test_a_share_on_a_box_of_cpu_slots_only_is_refused(client: TestClient, add_worker: Any) -> None:
    add_worker("cpubox")
    r = client.post("/api/v1/jobs", json={**SPEC, "gpu_memory_gb": 8})
    assert r.status_code == 422
    assert "no registered worker has CUDA GPUs" in r.text


def test_a_queued_share_says_what_it_waits_for(client: TestClient, engine: Engine) -> None:
    gpu_worker(engine)
    r = client.post("/api/v1/jobs", json={**SPEC, "gpu_memory_gb": 12.5})
    assert r.status_code == 201, r.text
    job = r.json()
    assert job["gpu_memory_gb"] == 12.5
    assert job["reason"]["message"].startswith("waiting for a worker with 12.5 GiB free on one GPU")
    listed = client.get(f"/api/v1/jobs/{job['id']}").json()
    assert "waiting for 12.5 GiB free on one GPU" in listed["reason"]["message"]


def test_shares_are_claimed_by_room_and_whole_jobs_by_free_gpus(engine: Engine) -> None:
    whole = enqueue(engine, priority=5)
    big = enqueue(engine, gpu_memory_gb=100, priority=3)
    small = enqueue(engine, gpu_memory_gb=20)
    # Both GPUs hold shares: no whole one is free, and only a share that fits the largest
    # room may start; the whole-GPU job, first in line, is passed over.
    got = claim(engine, free_devices=0, gpu_room_gb=60.0)
    assert got is not None and got.fence.job_id == small and got.gpu_memory_gb == 20
    assert claim(engine, free_devices=0, gpu_room_gb=60.0) is None  # big: 100 > 60
    # A GPU held whole, the other free: the whole job goes first (priority)...
    got = claim(engine, free_devices=1, gpu_room_gb=139.9)
    assert got is not None and got.fence.job_id == whole and got.gpu_memory_gb is None
    # ...then the share, into the room of the GPU that is left.
    got = claim(engine, free_devices=1, gpu_room_gb=139.9)
    assert got is not None and got.fence.job_id == big
    assert store.load_job(engine, big).status == JobStatus.running


def test_a_worker_without_gpus_never_claims_a_share(engine: Engine) -> None:
    enqueue(engine, gpu_memory_gb=1)  # accelerator auto: a CPU worker serves auto jobs
    cpu = {**CLAIM, "accelerator": "cpu", "gpu_room_gb": 0.0, "gpu_total_gb": 0.0}
    assert store.claim_job(engine, **cpu) is None
    assert (
        store.pending_count(engine, max_devices=2, accelerator="cpu", recipes=cpu["recipes"]) == 0
    )
    assert store.pending_count(
        engine, max_devices=2, accelerator="cuda", recipes=cpu["recipes"], gpu_total_gb=139.9
    ) == 1  # fmt: skip


def test_a_starving_whole_gpu_job_stops_new_shares(engine: Engine) -> None:
    """The reservation rule covers shares: once the oldest job (here a whole-GPU one) has
    waited past reserve_after_s, no share is packed onto the GPUs it waits for."""
    whole = enqueue(engine)
    enqueue(engine, gpu_memory_gb=10, priority=9)
    assert claim(engine, free_devices=0, gpu_room_gb=100.0, reserve_after_s=0.0) is None
    got = claim(engine, free_devices=1, gpu_room_gb=100.0, reserve_after_s=0.0)
    assert got is not None and got.fence.job_id == whole
