"""The outbox, on both databases: a job's end (and a requeue) and a sweep's end enqueue one
delivery per matching webhook in the transaction of the change, nothing if it rolls
back, and cost one indexed statement when no webhook matches."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, event, select, text
from sqlmodel import col

from service import store
from service.db import read_session, write_session
from service.models import JobCreate, JobStatus
from service.reasons import ReasonCode as R
from service.store import Outcome
from service.store.transitions import cancel_in
from service.users import BOOTSTRAP
from service.webhooks.models import WebhookDelivery
from tests.service.webhooks.conftest import as_user

HOOKS = "/api/v1/webhooks"
PUBLIC = "https://93.184.215.14/hook"
WORKER: dict[str, Any] = {
    "worker_id": "w", "free_devices": 2, "accelerator": "cpu", "recipes": ["r"], "lease_s": 30,
}  # fmt: skip
ALL_JOB_EVENTS = ["job.succeeded", "job.failed", "job.cancelled", "job.requeued"]


def deliveries(engine: Engine) -> list[WebhookDelivery]:
    with read_session(engine) as session:
        query = select(WebhookDelivery).order_by(col(WebhookDelivery.id))
        return list(session.execute(query).scalars())


def new_job(engine: Engine, owner: str = "admin", **spec: Any) -> int:
    job, _ = store.create_job(engine, JobCreate(recipe="r", name="j", **spec), owner=owner)
    assert job.id is not None
    return job.id


def test_each_end_and_a_requeue_is_enqueued_once_per_webhook_that_wants_it(
    client: TestClient, engine: Engine
) -> None:
    every = client.post(HOOKS, json={"url": PUBLIC, "events": ALL_JOB_EVENTS}).json()
    ends = client.post(HOOKS, json={"url": PUBLIC, "events": ["job.succeeded"]}).json()
    job_id = new_job(engine)
    claimed = store.claim_job(engine, **WORKER)
    assert claimed is not None and claimed.fence.job_id == job_id
    assert deliveries(engine) == []  # the claim tells no one (no job.started)
    store.release_attempt(engine, claimed.fence, R.worker_shutdown, "its worker stopped")
    claimed = store.claim_job(engine, **WORKER)
    assert claimed is not None
    store.finish_attempt(engine, claimed.fence, Outcome(JobStatus.succeeded, R.succeeded, "ok"))
    got = [(d.webhook_id, d.event, d.subject, d.state, d.attempts) for d in deliveries(engine)]
    assert got == [
        (every["id"], "job.requeued", f"job {job_id}", "pending", 0),
        (every["id"], "job.succeeded", f"job {job_id}", "pending", 0),
        (ends["id"], "job.succeeded", f"job {job_id}", "pending", 0),
    ]
    payload = deliveries(engine)[-1].payload
    assert payload["event"] == "job.succeeded" and payload["created_at"]
    job = payload["job"]
    assert job["id"] == job_id and job["status"] == "succeeded" and job["owner"] == "admin"
    assert job["attempt"] == 1 and job["reason_code"] == "succeeded" and job["name"] == "j"
    assert job["url_path"] == f"/api/v1/jobs/{job_id}" and job["recipe"] == "r"
    assert job["started_at"] and job["finished_at"] and job["sweep_id"] is None
    assert set(job) == {
        "id", "name", "owner", "status", "reason_code", "reason_message", "recipe",
        "sweep_id", "attempt", "created_at", "started_at", "finished_at", "url_path",
    }  # fmt: skip
    queued = deliveries(engine)[0].payload["job"]
    assert queued["status"] == "queued" and queued["reason_code"] == "worker_shutdown"


def test_a_users_webhook_hears_of_their_jobs_and_an_all_users_one_of_everyones(
    client: TestClient, engine: Engine
) -> None:
    alice, bob = as_user(client, "alice"), as_user(client, "bob")
    hers = client.post(HOOKS, json={"url": PUBLIC}, headers=alice).json()
    client.post(HOOKS, json={"url": PUBLIC}, headers=bob)
    every = client.post(HOOKS, json={"url": PUBLIC, "all_users": True}).json()
    for owner in ("alice", "carol"):
        store.cancel_job(engine, new_job(engine, owner=owner))
    got = sorted((d.webhook_id, d.payload["job"]["owner"]) for d in deliveries(engine))
    assert got == sorted([(hers["id"], "alice"), (every["id"], "alice"), (every["id"], "carol")])


def test_a_change_that_rolls_back_enqueues_nothing(client: TestClient, engine: Engine) -> None:
    client.post(HOOKS, json={"url": PUBLIC})
    job_id = new_job(engine)
    with pytest.raises(RuntimeError, match="after the change"), write_session(engine) as session:
        cancel_in(session, job_id, BOOTSTRAP)
        assert len(session.execute(select(WebhookDelivery)).all()) == 1  # in its transaction
        raise RuntimeError("something failed after the change, in its transaction")
    assert deliveries(engine) == []
    assert store.cancel_job(engine, job_id).status == JobStatus.cancelled
    [sent] = deliveries(engine)
    assert sent.event == "job.cancelled" and sent.payload["job"]["status"] == "cancelled"


def test_an_inactive_webhook_hears_nothing(client: TestClient, engine: Engine) -> None:
    hook = client.post(HOOKS, json={"url": PUBLIC}).json()
    with write_session(engine) as session:
        off = text("UPDATE webhook SET active = false WHERE id = :id")
        session.execute(off, {"id": hook["id"]})
    store.cancel_job(engine, new_job(engine))
    assert deliveries(engine) == []


def test_with_no_webhook_a_job_end_costs_one_indexed_statement(engine: Engine) -> None:
    job_id = new_job(engine)
    sent: list[tuple[str, Any]] = []

    def keep(_c: Any, _cur: Any, statement: str, params: Any, _ctx: Any, _many: bool) -> None:
        if "webhook" in statement:
            sent.append((statement, params))

    event.listen(engine, "before_cursor_execute", keep)
    try:
        store.cancel_job(engine, job_id)
    finally:
        event.remove(engine, "before_cursor_execute", keep)
    [(statement, params)] = sent
    assert statement.startswith("INSERT INTO webhook_delivery")
    if engine.dialect.name != "sqlite":
        return  # PostgreSQL plans a table this small by cost: a scan is its cheapest read
    with engine.connect() as conn:
        plan = "\n".join(
            str(row[-1]) for row in conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {statement}", params)
        )
    reads = [line for line in plan.splitlines() if re.search(r"\bwebhook\b", line)]
    assert reads and all("USING" in line and "INDEX" in line for line in reads), plan


def test_a_sweeps_end_is_enqueued(
    client: TestClient, engine: Engine, add_worker: Callable[..., Any]
) -> None:
    add_worker()
    hook = client.post(HOOKS, json={"url": PUBLIC, "events": ["sweep.cancelled"]}).json()
    spec = {
        "name": "s",
        "job": {"recipe": "tiny", "accelerator": "cpu"},
        "parameters": {"lr": {"type": "float", "low": 1e-3, "high": 0.1}},
        "metric": "val/loss",
        "max_trials": 2,
    }
    sweep = client.post("/api/v1/sweeps", json=spec).json()
    assert client.post(f"/api/v1/sweeps/{sweep['id']}/cancel").status_code == 202
    assert client.post(f"/api/v1/sweeps/{sweep['id']}/cancel").status_code == 202  # idempotent
    [sent] = deliveries(engine)
    assert sent.webhook_id == hook["id"] and sent.subject == f"sweep {sweep['id']}"
    body = sent.payload["sweep"]
    assert sent.payload["event"] == "sweep.cancelled" and body["status"] == "cancelled"
    assert body["name"] == "s" and body["owner"] == "admin" and body["finished_at"]
    assert body["url_path"] == f"/api/v1/sweeps/{sweep['id']}"
    assert body["reason_code"] == "cancelled" and body["reason_message"] == "cancelled by admin"
