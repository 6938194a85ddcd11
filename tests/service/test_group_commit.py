"""Concurrent submits share transactions and each gets its own job back."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

from sqlalchemy import Engine, func, select, text

from service import store
from service.db import read_session, write_session
from service.group_commit import committer
from service.models import Job, JobCreate


def test_concurrent_submits_each_get_their_own_job(engine: Engine) -> None:
    def submit(i: int) -> tuple[int, Job]:
        job, created = store.create_job(engine, JobCreate(recipe="r", seed=i, name=f"job {i}"))
        assert created
        return i, job

    with ThreadPoolExecutor(max_workers=32) as pool:
        results = list(pool.map(submit, range(400)))
    assert all(job.seed == i and job.name == f"job {i}" for i, job in results)
    ids = [job.id for _, job in results]
    assert len(set(ids)) == 400
    with read_session(engine) as session:
        stored = dict(session.execute(select(Job.id, Job.seed)).all())
        assert session.execute(select(func.count()).select_from(Job)).scalar_one() == 400
    assert all(stored[job.id] == i for i, job in results)  # the row behind each answer


def test_an_event_loop_awaits_its_submit_without_a_thread(engine: Engine) -> None:
    async def submit_many() -> list[object]:
        specs = [JobCreate(recipe="r", seed=i) for i in range(50)]
        return await asyncio.gather(*(store.enqueue_job(engine, spec) for spec in specs))

    rows = asyncio.run(submit_many())
    assert [row.seed for row in rows] == list(range(50))  # type: ignore[attr-defined]
    with read_session(engine) as session:
        stored = dict(session.execute(select(Job.id, Job.seed)).all())
    assert {row.id: row.seed for row in rows} == stored  # type: ignore[attr-defined]


def test_a_submit_cancelled_before_its_batch_is_never_written(engine: Engine) -> None:
    """A request whose client went away before its batch began is dropped; the writer
    carries on with the next."""
    writer = committer(engine, store._insert_jobs)
    row = store._row(JobCreate(recipe="r"), ("queued", "waiting"))
    with write_session(engine) as session:  # the write lock, so the writer's batch waits
        if engine.dialect.name == "postgresql":
            session.execute(text("LOCK TABLE job IN EXCLUSIVE MODE"))
        first = writer.enqueue({**row, "seed": 1})
        deadline = time.monotonic() + 10
        while not first.running() and time.monotonic() < deadline:
            time.sleep(0.005)
        assert first.running()  # taken into a batch: it can no longer be cancelled
        assert not first.cancel()
        second = writer.enqueue({**row, "seed": 2})
        assert second.cancel()  # still queued: the client went away
    third = writer.enqueue({**row, "seed": 3})
    assert (first.result(timeout=10).seed, third.result(timeout=10).seed) == (1, 3)
    with read_session(engine) as session:
        assert sorted(session.execute(select(Job.seed)).scalars()) == [1, 3]
