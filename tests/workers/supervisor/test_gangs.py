"""A worker's side of a gang (workers.supervisor.gangs) against a real PostgreSQL: joining, giving
its devices back after the timeout, and stopping while the gang completes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from service import store
from service.models import JobCreate, JobStatus
from service.settings import Settings
from workers.supervisor.gangs import Gangs

pytestmark = pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
SPEC: dict[str, Any] = {
    "recipe": "mlp-regression", "strategy": "ddp", "devices": 1, "nodes": 2,
    "accelerator": "cpu", "batch_size": 64,
}  # fmt: skip


def gangs(engine: Engine, settings: Settings, worker: str, **more: Any) -> Gangs:
    shared = settings.model_copy(update={"shared_dir": Path("/tmp/shared"), **more})
    return Gangs(engine, shared, worker)


def step(box: Gangs, running: set[int] | None = None) -> Any:
    return box.step([0], 1, "cpu", ["mlp-regression"], running or set())


def test_two_boxes_start_the_job_each_with_its_node(engine: Engine, settings: Settings) -> None:
    job, _ = store.create_job(engine, JobCreate(**SPEC))
    a, b = gangs(engine, settings, "box-a"), gangs(engine, settings, "box-b")
    assert a.enabled and step(a) is None and a.held() == [0]  # joined, holding its slot
    started_b = step(b)
    started_a = step(a)
    assert started_a is not None and started_b is not None
    assert (started_a.node, started_b.node) == (0, 1)
    assert started_a.claim.fence == started_b.claim.fence  # one lease, every node
    assert started_a.rendezvous == started_b.rendezvous  # node 0's
    assert started_a.rendezvous.startswith("127.0.0.1:")
    assert started_a.workers == started_b.workers == ["box-a", "box-b"]
    assert a.held() == [] and b.held() == []
    assert step(b, running={job.id}) is None  # its node of this job is running


def test_a_box_alone_gives_its_devices_back_after_the_timeout(
    engine: Engine, settings: Settings
) -> None:
    job, _ = store.create_job(engine, JobCreate(**SPEC))
    a = gangs(engine, settings, "box-a", gang_timeout_s=30)
    step(a)
    assert a.waiting is not None
    a.waiting.since -= 31  # as if it had waited past gang_timeout_s
    step(a)  # it leaves
    assert a.waiting is None and a.held() == []
    assert store.gang.gang_of(engine, job.id).members == []
    assert step(a) is None and a.waiting is None  # nor joins again for gang_timeout_s


def test_a_box_stopping_as_its_gang_completes_hands_the_job_back(
    engine: Engine, settings: Settings
) -> None:
    job, _ = store.create_job(engine, JobCreate(**SPEC))
    a, b = gangs(engine, settings, "box-a"), gangs(engine, settings, "box-b")
    step(a)
    step(b)  # the gang is whole: the job runs, but box-a is stopping and will not start
    assert store.load_job(engine, job.id).status == JobStatus.running
    a.leave_all()
    back = store.load_job(engine, job.id)
    assert back.status == JobStatus.queued and back.attempt == 1  # no attempt spent
    assert back.reason_code == "worker_shutdown"
    assert store.gang.gang_of(engine, job.id).members == []  # box-b's node is off too
