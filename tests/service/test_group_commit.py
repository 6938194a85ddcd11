"""Concurrent submits share transactions and each gets its own job back."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest
from sqlalchemy import Engine, func, select, text

from service import store
from service.db import read_session, write_session
from service.group_commit import GroupCommit, committer
from service.models import BOOTSTRAP_USER, Job, JobCreate
from service.reasons import ReasonCode
from service.store.submit import NewJob, insert_jobs, job_row


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


def test_submits_awaited_on_an_event_loop_each_get_their_row(engine: Engine) -> None:
    async def submit_many() -> list[object]:
        specs = [JobCreate(recipe="r", seed=i) for i in range(50)]
        return await asyncio.gather(*(store.enqueue_job(engine, spec) for spec in specs))

    rows = asyncio.run(submit_many())
    assert [row.seed for row in rows] == list(range(50))  # type: ignore[attr-defined]
    with read_session(engine) as session:
        stored = dict(session.execute(select(Job.id, Job.seed)).all())
    assert {row.id: row.seed for row in rows} == stored  # type: ignore[attr-defined]


@contextlib.contextmanager
def first_batch_waiting(engine: Engine, writer: GroupCommit, row: NewJob) -> Iterator[Future[Any]]:
    """``row`` taken into the writer's batch, which waits for the write lock held here
    until the block ends: what the block enqueues makes the writer's next batch."""
    with write_session(engine) as session:
        if engine.dialect.name == "postgresql":
            session.execute(text("LOCK TABLE job IN EXCLUSIVE MODE"))
        first = writer.enqueue(row)
        deadline = time.monotonic() + 10
        while not first.running() and time.monotonic() < deadline:
            time.sleep(0.005)
        assert first.running()  # taken into a batch: it can no longer be cancelled
        yield first


def test_a_submit_cancelled_before_its_batch_is_never_written(engine: Engine) -> None:
    """A request whose client went away before its batch began is dropped; the writer
    carries on with the next."""
    writer = committer(engine, insert_jobs)
    row = job_row(JobCreate(recipe="r"), (ReasonCode.queued, "waiting"), BOOTSTRAP_USER)
    submits = []
    with first_batch_waiting(engine, writer, NewJob({**row, "seed": 0})) as first:
        assert not first.cancel()
        submits.append(first)
        while True:  # once the writer waits for the lock, what comes next stays queued
            queued = writer.enqueue(NewJob({**row, "seed": len(submits)}))
            submits.append(queued)
            if queued.cancel():  # still queued: its client went away
                break
            assert len(submits) < 100
    last = writer.enqueue(NewJob({**row, "seed": len(submits)}))
    submits.append(last)
    assert last.result(timeout=10).seed == len(submits) - 1  # the writer carried on
    assert [f.cancelled() for f in submits].count(True) == 1
    written = [f.result(timeout=10).seed for f in submits if not f.cancelled()]
    with read_session(engine) as session:  # every other row, and not the cancelled one
        assert sorted(session.execute(select(Job.seed)).scalars()) == sorted(written)


@pytest.mark.parametrize(
    "refused",
    [
        {"seed": 2**70},  # past the column: SQLite cannot bind it, PostgreSQL's is 32 bits
        {"status": None},  # NOT NULL
        {"name": "nul \x00"},  # PostgreSQL's text refuses NUL (SQLite stores it)
    ],
    ids=["huge-int", "null", "nul"],
)
def test_a_row_the_database_refuses_fails_only_its_own_submit(
    engine: Engine, refused: dict[str, Any]
) -> None:
    """One bad row once failed every submit of its batch. The row here
    passed no validation (it is built by hand), as one that got past it would."""
    if "name" in refused and engine.dialect.name == "sqlite":
        pytest.skip("SQLite stores a NUL")
    writer = committer(engine, insert_jobs)
    row = job_row(JobCreate(recipe="r"), (ReasonCode.queued, "waiting"), BOOTSTRAP_USER)
    with first_batch_waiting(engine, writer, NewJob({**row, "seed": 0})) as first:
        good = [writer.enqueue(NewJob({**row, "seed": i})) for i in range(1, 4)]
        bad = writer.enqueue(NewJob({**row, **refused}))
        good += [writer.enqueue(NewJob({**row, "seed": i})) for i in range(4, 7)]
    assert [f.result(timeout=10).seed for f in [first, *good]] == list(range(7))
    with pytest.raises(Exception) as refusal:
        bad.result(timeout=10)
    assert not isinstance(refusal.value, AssertionError)
    with read_session(engine) as session:  # every good row, and nothing of the bad one
        assert sorted(session.execute(select(Job.seed)).scalars()) == list(range(7))
    assert writer.enqueue(NewJob({**row, "seed": 7})).result(timeout=10).seed == 7  # it carries on
