"""Concurrent submits share transactions and each gets its own job back."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from sqlalchemy import Engine, func, select

from service import store
from service.db import read_session
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
