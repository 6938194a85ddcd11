"""Preemption's rule on plain values, and the contenders the store gives
a worker, on both databases."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import Engine, update

from service import store
from service.models import Job, JobCreate, User, utcnow
from service.preemption import FAR_BELOW, Contender, choose, outranks
from service.store.preemption import contenders, mark_preempted

LIGHT, HEAVY = 10.0, 10.0 + FAR_BELOW  # fair-share scores: HEAVY has 4x the usage


def job(job_id: int, score: float, priority: int = 0, devices: int = 1) -> Contender:
    return Contender(job_id, f"user{score:g}", score, priority, devices)


def test_a_waiting_job_outranks_what_the_claim_would_serve_after_it_by_a_margin() -> None:
    assert outranks(job(1, LIGHT), job(2, HEAVY))  # a quarter of the usage
    assert not outranks(job(1, LIGHT + 0.5), job(2, HEAVY))  # lighter, but not by enough
    assert outranks(job(1, LIGHT, priority=5), job(2, LIGHT))  # same usage, higher priority
    assert not outranks(job(1, HEAVY, priority=5), job(2, LIGHT))  # heavier: never
    assert not outranks(job(1, LIGHT), job(2, LIGHT))  # equal: first come, first served


def test_victims_are_the_lowest_ranked_and_no_more_than_needed() -> None:
    running = [job(10, HEAVY, priority=1), job(11, HEAVY), job(12, LIGHT + 1)]
    chosen = choose([job(1, LIGHT, devices=2)], running, free=0)
    assert chosen is not None
    waiting, victims = chosen
    # 12 is not outranked (not far enough above); of 10 and 11, 11 ranks lower
    assert waiting.job_id == 1 and [v.job_id for v in victims] == [11, 10]
    assert choose([job(1, LIGHT, devices=1)], running, free=0)[1] == [running[1]]  # type: ignore[index]


def test_nothing_is_stopped_for_a_job_that_would_still_not_fit() -> None:
    running = [job(10, HEAVY), job(11, LIGHT)]
    assert choose([job(1, LIGHT, devices=2)], running, free=0) is None  # 11 stays: 1 of 2
    assert choose([job(1, LIGHT, devices=2)], running, free=1) is not None
    assert choose([job(1, LIGHT, devices=1)], running, free=1) is None  # it fits already
    # the first waiting job cannot be helped; the next one can
    got = choose([job(1, LIGHT, devices=3), job(2, LIGHT)], running, free=0)
    assert got is not None and got[0].job_id == 2


def submit(engine: Engine, owner: str, **spec: Any) -> int:
    made, _ = store.create_job(engine, JobCreate(recipe="r", **spec), owner=owner)
    assert made.id is not None
    return made.id


def test_the_store_gives_long_waiting_jobs_in_claim_order_and_stoppable_running_ones(
    engine: Engine,
) -> None:
    with engine.begin() as conn:
        conn.execute(User.__table__.insert(), [  # type: ignore[attr-defined]
            {"name": "light", "admin": False, "usage_score": LIGHT, "created_at": utcnow()},
            {"name": "heavy", "admin": False, "usage_score": HEAVY, "created_at": utcnow()},
        ])  # fmt: skip
    ran = [submit(engine, "heavy", priority=p) for p in (0, 0, 0)]
    pinned = submit(engine, "heavy", preemptible=False)
    waits = [submit(engine, "heavy", devices=2), submit(engine, "light", devices=2)]
    young = submit(engine, "light")
    shared = submit(engine, "light", gpu_memory_gb=4)
    long_ago = utcnow() - timedelta(minutes=10)
    with engine.begin() as conn:
        conn.execute(update(Job).where(Job.id.in_([*ran, pinned])).values(status="running"))  # type: ignore[union-attr]
        conn.execute(update(Job).where(Job.id.in_([*waits, shared])).values(created_at=long_ago))  # type: ignore[union-attr]
        conn.execute(update(Job).where(Job.id == ran[2]).values(preempted_at=utcnow()))
    waiting, running = contenders(
        engine, accelerator="cpu", recipes=["r"], total_devices=2, running=[*ran, pinned],
        now=utcnow(), waited_s=60, cooldown_s=3600,
    )  # fmt: skip
    # the light user's first; the young job has not waited; a share frees no device
    assert [w.job_id for w in waiting] == [waits[1], waits[0]]
    assert young not in {w.job_id for w in waiting}
    # pinned is not preemptible; ran[2] was preempted a moment ago
    assert sorted(r.job_id for r in running) == ran[:2]
    assert running[0].score == HEAVY and running[0].owner == "heavy"


def test_the_mark_is_fenced(engine: Engine) -> None:
    submit(engine, "admin")
    claimed = store.claim_job(
        engine, worker_id="w", free_devices=1, accelerator="cpu", recipes=["r"], lease_s=30
    )
    assert claimed is not None
    by = job(99, LIGHT)
    stale = store.Fence(claimed.fence.job_id, claimed.fence.attempt, "not-the-token")
    assert not mark_preempted(engine, stale, by)
    assert mark_preempted(engine, claimed.fence, by)
    assert store.load_job(engine, claimed.fence.job_id).preempted_at is not None
