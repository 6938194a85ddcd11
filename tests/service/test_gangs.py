"""Jobs across boxes as the service sees them: the spec's rules at submit, the
claim that never takes one, and the gang (service.store.gang) on a real PostgreSQL:
all nodes or none, one job joined at a time, members that leave or go silent, the
reservation, quotas counting every node, and a requeue dissolving the gang."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, update

from service import store
from service.models import JobCreate, JobStatus, utcnow
from service.reasons import ReasonCode
from service.store import Outcome
from service.store.gang import node_table
from service.store.usage import user_table

ON_POSTGRES = pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
SPEC: dict[str, Any] = {
    "recipe": "mlp-regression",
    "strategy": "ddp",
    "devices": 2,
    "nodes": 2,
    "accelerator": "cpu",
    "batch_size": 64,
}
JOIN: dict[str, Any] = {
    "total": 2,
    "accelerator": "cpu",
    "recipes": ["mlp-regression"],
    "lease_s": 30.0,
    "reserve_after_s": None,
    "max_running": None,
    "shunned": set(),
}


def enqueue(engine: Engine, **spec: Any) -> int:
    job, _ = store.create_job(engine, JobCreate(**{**SPEC, **spec}))
    assert job.id is not None
    return job.id


def join(engine: Engine, worker: str, free: list[int] | None = None, **more: Any) -> Any:
    endpoint = f"10.0.0.{worker[-1]}:29400"
    return store.gang.head_job(
        engine, worker_id=worker, free=[0, 1] if free is None else free, endpoint=endpoint,
        **{**JOIN, **more},
    )  # fmt: skip


def status(engine: Engine, job_id: int) -> JobStatus:
    return JobStatus(store.gang.gang_of(engine, job_id).status)


@pytest.mark.parametrize(
    ("spec", "field", "words"),
    [
        ({"strategy": "single", "devices": 1}, "strategy", "give strategy: ddp"),
        ({"strategy": "dp"}, "strategy", "give strategy: ddp"),
        ({"batch_size": 66}, "batch_size", "multiple of nodes x devices"),
        ({"nodes": 65}, "nodes", "less than or equal to 64"),
        ({"nodes": 0}, "nodes", "greater than or equal to 1"),
    ],
)
@ON_POSTGRES
def test_a_spec_across_boxes_is_checked_at_submit(
    client: TestClient, add_worker: Any, spec: dict[str, Any], field: str, words: str
) -> None:
    add_worker("box1")
    r = client.post("/api/v1/jobs", json={**SPEC, **spec})
    assert r.status_code == 422, r.text
    errors = r.json()["detail"]
    assert any(e["loc"][-1] == field and words in e["msg"] for e in errors), errors


@ON_POSTGRES
def test_more_boxes_than_workers_that_take_them_is_refused(
    client: TestClient, add_worker: Any
) -> None:
    add_worker("box1", across_boxes=True)
    add_worker("box2")  # no SHARED_DIR: it takes no job across boxes
    r = client.post("/api/v1/jobs", json=SPEC)
    assert r.status_code == 422, r.text
    [error] = r.json()["detail"]
    assert error["loc"][-1] == "nodes"
    assert "1 registered worker(s) take jobs across boxes" in error["msg"]
    add_worker("box3", across_boxes=True)
    assert client.post("/api/v1/jobs", json=SPEC).status_code == 201


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_across_boxes_is_refused_on_sqlite_saying_why(client: TestClient, add_worker: Any) -> None:
    add_worker("box1")
    r = client.post("/api/v1/jobs", json=SPEC)
    assert r.status_code == 422, r.text
    [error] = r.json()["detail"]
    assert error["loc"][-1] == "nodes" and "share one PostgreSQL database" in error["msg"]
    assert client.post("/api/v1/jobs", json={**SPEC, "nodes": 1}).status_code == 201


def test_the_claim_never_takes_a_job_across_boxes(engine: Engine) -> None:
    """On both databases: only a gang starts it (a lone worker would run half a world)."""
    across = enqueue(engine)
    claimed = store.claim_job(
        engine, worker_id="box1", free_devices=2, accelerator="cpu",
        recipes=["mlp-regression"], lease_s=30.0,
    )  # fmt: skip
    assert claimed is None
    assert (
        store.pending_count(engine, max_devices=2, accelerator="cpu", recipes=["mlp-regression"])
        == 0
    )
    one_box = enqueue(engine, nodes=1)
    claimed = store.claim_job(
        engine, worker_id="box1", free_devices=2, accelerator="cpu",
        recipes=["mlp-regression"], lease_s=30.0,
    )  # fmt: skip
    assert claimed is not None and claimed.fence.job_id == one_box != across


@ON_POSTGRES
def test_the_job_starts_when_the_last_node_joins_and_not_before(
    client: TestClient, engine: Engine, add_worker: Any
) -> None:
    for box in ("box1", "box2", "box3"):
        add_worker(box, across_boxes=True)
    job_id = enqueue(engine, nodes=3, batch_size=60)
    a = join(engine, "box1")
    assert a.joined is not None and a.joined.node == 0 and a.joined.devices == [0, 1]
    b = join(engine, "box2")
    assert b.joined is not None and b.joined.node == 1
    assert status(engine, job_id) == JobStatus.queued  # 2 of 3: nothing starts
    shown = client.get(f"/api/v1/jobs/{job_id}").json()
    assert [n["worker_id"] for n in shown["node_list"]] == ["box1", "box2"]
    assert "2 of 3 nodes free" in shown["reason"]["message"]
    assert join(engine, "box1").joined is None  # a worker is one node of a gang
    c = join(engine, "box3")
    assert c.joined is not None and c.joined.node == 2
    gang = store.gang.gang_of(engine, job_id)
    assert gang.status == JobStatus.running and gang.claim is not None
    assert [m.worker_id for m in gang.members] == ["box1", "box2", "box3"]
    assert gang.members[0].endpoint == "10.0.0.1:29400"  # node 0's: the rendezvous
    job = store.load_job(engine, job_id)
    assert job.worker_id == "box1" and job.attempt == 1
    assert job.reason_message == "attempt running on 3 nodes: box1, box2, box3"
    # every node holds the one fence: each renews the same lease
    held = store.renew_lease(engine, [gang.claim.fence], 30.0)
    assert held[job_id].status == JobStatus.running


@ON_POSTGRES
def test_a_node_that_leaves_or_goes_silent_is_not_counted(engine: Engine) -> None:
    job_id = enqueue(engine)
    join(engine, "box1")
    assert store.gang.leave(engine, job_id, "box1") is True  # its timeout: gives back
    join(engine, "box2")
    with engine.begin() as conn:  # box2's worker stopped renewing long ago
        conn.execute(update(node_table).values(renewed_at=utcnow() - timedelta(seconds=60)))
    join(engine, "box3")
    assert status(engine, job_id) == JobStatus.queued  # box2 was dropped, not counted
    assert [m.worker_id for m in store.gang.gang_of(engine, job_id).members] == ["box3"]
    join(engine, "box4")
    assert status(engine, job_id) == JobStatus.running
    assert store.gang.leave(engine, job_id, "box4") is False  # too late: it is a node


@ON_POSTGRES
def test_every_worker_joins_the_same_job_first(engine: Engine) -> None:
    """Two jobs across boxes and two boxes: both join the first (priority, then age), so
    neither job holds half the boxes for ever."""
    first = enqueue(engine)
    second = enqueue(engine, priority=5)
    assert join(engine, "box1").job_id == second
    assert join(engine, "box2").job_id == second
    assert status(engine, second) == JobStatus.running
    assert status(engine, first) == JobStatus.queued
    # a box that gave up on the first lately joins no gang meanwhile (it serves one-box
    # jobs), and the job still counts as the head: it may reserve
    assert join(engine, "box3", shunned={first}) == (first, None, False)


@ON_POSTGRES
def test_a_box_without_its_devices_free_reserves_them_once_the_job_waited(engine: Engine) -> None:
    job_id = enqueue(engine)
    busy = join(engine, "box1", free=[1], reserve_after_s=3600)
    assert busy.job_id == job_id and busy.joined is None and not busy.reserving
    with engine.begin() as conn:  # it has waited an hour now
        conn.execute(
            update(store.tables.job_table).values(created_at=utcnow() - timedelta(hours=2))
        )
    busy = join(engine, "box1", free=[1], reserve_after_s=3600)
    assert busy.joined is None and busy.reserving  # claims nothing else meanwhile
    # a box that gave up on it lately still reserves: else small jobs take the devices
    # its gang waits for every time it steps aside
    shunned = join(engine, "box2", reserve_after_s=3600, shunned={job_id})
    assert shunned.joined is None and shunned.reserving


@ON_POSTGRES
def test_quotas_count_every_nodes_devices(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(update(user_table).values(max_running_devices=3))
    job_id = enqueue(engine)  # 2 nodes x 2 devices = 4 > 3
    blocked = join(engine, "box1", reserve_after_s=0)
    assert blocked.joined is None  # waiting on its owner's quota, which no box can free:
    assert not blocked.reserving  # it reserves nothing
    with engine.begin() as conn:
        conn.execute(update(user_table).values(max_running_devices=4))
    join(engine, "box1")
    join(engine, "box2")
    assert status(engine, job_id) == JobStatus.running
    # running, it holds 4 devices of the quota: a one-box job waits for them
    with engine.begin() as conn:
        conn.execute(update(user_table).values(max_running_devices=5))
    enqueue(engine, nodes=1)
    assert store.claim_job(
        engine, worker_id="box3", free_devices=2, accelerator="cpu",
        recipes=["mlp-regression"], lease_s=30.0,
    ) is None  # fmt: skip


@ON_POSTGRES
def test_a_silent_node_is_lost_a_done_one_is_not_and_a_requeue_ends_the_gang(
    engine: Engine,
) -> None:
    job_id = enqueue(engine, max_attempts=3)
    join(engine, "box1")
    join(engine, "box2")
    gang = store.gang.gang_of(engine, job_id)
    assert gang.claim is not None
    assert store.gang.lost_nodes(engine, [job_id], 30.0) == {}
    with engine.begin() as conn:
        conn.execute(update(node_table).values(renewed_at=utcnow() - timedelta(seconds=60)))
    store.gang.renew_nodes(engine, "box1", [job_id])
    [lost] = store.gang.lost_nodes(engine, [job_id], 30.0)[job_id]
    assert lost.worker_id == "box2" and lost.node == 1
    store.gang.node_done(engine, job_id, "box2")  # its ranks ended well: not lost
    assert store.gang.lost_nodes(engine, [job_id], 30.0) == {}
    outcome = Outcome(JobStatus.failed, ReasonCode.worker_lost, "node 1 lost", retryable=True)
    requeued = store.finish_attempt(engine, gang.claim.fence, outcome)
    assert requeued is not None and requeued.status == JobStatus.queued
    assert store.gang.gang_of(engine, job_id).members == []  # the next attempt: a new gang


@ON_POSTGRES
def test_a_node_whose_worker_restarts_requeues_the_job_under_its_name(engine: Engine) -> None:
    job_id = enqueue(engine)
    join(engine, "box1")
    join(engine, "box2")
    store.gang.node_done(engine, job_id, "box2")  # its ranks ended well: not its job now
    assert store.abandon_worker_jobs(engine, "box2") == []
    with engine.begin() as conn:
        conn.execute(update(node_table).values(done_at=None))
    assert store.abandon_worker_jobs(engine, "box2") == [job_id]
    job = store.load_job(engine, job_id)
    assert job.status == JobStatus.queued and job.reason_code == ReasonCode.worker_restarted
    assert job.reason_message.startswith("worker box2 restarted"), job.reason_message
