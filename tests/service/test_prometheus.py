"""/metrics parses with the Prometheus client's own parser and counts what happened."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Engine

from service import store
from service.catalog import worker_heartbeat
from service.models import JobStatus
from service.reasons import ReasonCode as R
from service.store import Outcome
from workers import gpu

SPEC = {"recipe": "mlp-regression", "devices": 1, "accelerator": "cpu"}


def scrape(client: TestClient) -> dict[str, Any]:
    r = client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return {f.name: f for f in text_string_to_metric_families(r.text)}


def value(family: Any, sample: str, **labels: str) -> float:
    matches = [s.value for s in family.samples if s.name == sample and s.labels == labels]
    assert len(matches) == 1, (sample, labels, family.samples)
    return float(matches[0])


def test_metrics_count_jobs_workers_and_requests(
    client: TestClient, add_worker: Any, engine: Engine
) -> None:
    add_worker("box")
    ids = [client.post("/api/v1/jobs", json=SPEC).json()["id"] for _ in range(3)]
    job = store.claim_job(
        engine, worker_id="box", free_devices=1, accelerator="cpu",
        recipes=["mlp-regression"], lease_s=60,
    )  # fmt: skip
    assert job is not None and job.fence.job_id == ids[0]
    store.finish_attempt(
        engine, job.fence,
        Outcome(JobStatus.succeeded, R.succeeded, "trained"),
    )  # fmt: skip
    client.post(f"/api/v1/jobs/{ids[1]}/cancel")
    client.get("/api/v1/jobs/999")  # a 404, counted under its route

    families = scrape(client)
    jobs = families["trainyard_jobs"]
    assert value(jobs, "trainyard_jobs", status="queued") == 1
    assert value(jobs, "trainyard_jobs", status="succeeded") == 1
    assert value(jobs, "trainyard_jobs", status="cancelled") == 1
    assert value(families["trainyard_queue_depth"], "trainyard_queue_depth") == 1
    durations = families["trainyard_job_duration_seconds"]
    assert value(durations, "trainyard_job_duration_seconds_count") == 1
    age = value(families["trainyard_worker_heartbeat_age_seconds"],
                "trainyard_worker_heartbeat_age_seconds", worker="box")  # fmt: skip
    assert 0 <= age < 60
    requests = families["trainyard_http_requests"]
    post = dict(method="POST", route="/api/v1/jobs", status="201")
    assert value(requests, "trainyard_http_requests_total", **post) == 3
    missing = dict(method="GET", route="/api/v1/jobs/{job_id}", status="404")
    assert value(requests, "trainyard_http_requests_total", **missing) == 1
    latency = families["trainyard_http_request_duration_seconds"]
    count = value(latency, "trainyard_http_request_duration_seconds_count",
                  method="POST", route="/api/v1/jobs")  # fmt: skip
    assert count == 3


def test_gpu_gauges_come_from_what_worker_heartbeats_sampled(
    client: TestClient, add_worker: Any, engine: Engine
) -> None:
    add_worker("gpubox", slots=2, accelerator="cuda")
    sampled = [
        {"index": i, "kind": "cuda", "name": "H200", "utilization_percent": 50 + i,
         "memory_used_bytes": 2**30 * (i + 1), "memory_total_bytes": 141 * 2**30}
        for i in range(2)
    ]  # fmt: skip
    worker_heartbeat(engine, "gpubox", sampled)  # as a CUDA worker's heartbeat writes them
    add_worker("cpubox")  # CPU slots have no such gauges
    families = scrape(client)
    util = families["trainyard_gpu_utilization_percent"]
    assert value(util, "trainyard_gpu_utilization_percent", worker="gpubox", device="1",
                 name="H200") == 51  # fmt: skip
    used = families["trainyard_gpu_memory_used_bytes"]
    assert value(used, "trainyard_gpu_memory_used_bytes", worker="gpubox", device="0",
                 name="H200") == 2**30  # fmt: skip
    assert {s.labels["worker"] for s in util.samples} == {"gpubox"}
    assert gpu.sample([{"index": 0}]) is None  # this machine has no NVML: nothing made up
