"""Reading jobs: one, a page of them, a queued job's place, a worker's active jobs.

Reads change nothing. The API's reads return rows of the job table (its columns as
attributes); the worker's return ``Job`` objects it keeps past the session.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, Row, func, select
from sqlmodel import Session, col

from service.db import is_sqlite, read_session
from service.errors import JobNotFound
from service.models import Job, JobCreate, JobLike, JobStatus
from service.store.tables import job_table as _job
from service.store.tables import queued
from service.store.transitions import ACTIVE


def spec_of(job: JobLike) -> JobCreate:
    """The spec a job was submitted with."""
    return JobCreate.model_validate(job, from_attributes=True)


def get_job(session: Session, job_id: int) -> Row[Any]:
    """One job as a row of the job table (its columns as attributes), or JobNotFound.

    A row, not a ``Job``: the API reads jobs on every request, and building the ORM
    object (its attribute instrumentation) costs more than the query."""
    job = session.execute(select(_job).where(_job.c.id == job_id)).one_or_none()
    if job is None:
        raise JobNotFound(job_id)
    return job


def list_jobs(
    session: Session, *, status: JobStatus | None, limit: int, offset: int
) -> tuple[list[Row[Any]], int]:
    """Newest first (rows, as ``get_job``), with the total matching count."""
    query = select(_job)
    count = select(func.count()).select_from(_job)
    if status is not None:
        query = query.where(_job.c.status == status)
        count = count.where(_job.c.status == status)
    rows = session.execute(query.order_by(_job.c.id.desc()).limit(limit).offset(offset))
    total = session.execute(count).scalar_one()
    return list(rows), int(total)


def queue_position(session: Session, job: JobLike) -> int | None:
    """1-based place in the claim order of a queued job; None for any other status."""
    if job.status != JobStatus.queued:
        return None
    # Two index range counts (ix_job_claim), in one statement: one OR-ed condition would
    # scan the queue.
    is_queued = queued(_job)
    if is_sqlite(session.get_bind()):
        # Without statistics SQLite would count "priority > p" through the status index
        # (every queued job, a table row each: ~5 ms at 30,000 queued) rather than the
        # claim index's range; likely() tells it the status term does not narrow.
        is_queued = func.likely(is_queued)
    higher = select(func.count()).where(is_queued, _job.c.priority > job.priority)
    older = select(func.count()).where(
        queued(_job), _job.c.priority == job.priority, _job.c.id < job.id
    )
    ahead = session.execute(select(higher.scalar_subquery() + older.scalar_subquery()))
    return int(ahead.scalar_one()) + 1


def active_jobs_of(engine: Engine, worker_id: str) -> list[Job]:
    """Jobs a worker holds (running or cancelling)."""
    with read_session(engine) as session:
        query = select(Job).where(col(Job.status).in_(ACTIVE), Job.worker_id == worker_id)
        return list(session.exec(query).scalars())


def load_job(engine: Engine, job_id: int) -> Job:
    """Load a job outside any request (worker and runner side)."""
    with read_session(engine) as session:
        job = session.get(Job, job_id)
    if job is None:
        raise JobNotFound(job_id)
    return job
