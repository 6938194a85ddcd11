"""Reading jobs: one, a page of them, a queued job's place (fair share's), a worker's
active jobs.

Reads change nothing. The API's reads return rows of the job table (its columns as
attributes); the worker's return ``Job`` objects it keeps past the session.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from sqlalchemy import Engine, Row, and_, func, literal, or_, select
from sqlmodel import Session, col

from service.db import is_sqlite, read_session
from service.errors import JobNotFound
from service.models import Job, JobCreate, JobLike, JobStatus
from service.store.tables import job_table as _job
from service.store.tables import queued
from service.store.transitions import ACTIVE
from service.store.usage import running_devices
from service.store.usage import user_table as _user


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
    session: Session,
    *,
    status: JobStatus | None,
    limit: int,
    offset: int,
    owner: str | None = None,
    sweep: int | None = None,
) -> tuple[list[Row[Any]], int]:
    """Newest first (rows, as ``get_job``), with the total matching count."""
    query = select(_job)
    count = select(func.count()).select_from(_job)
    if sweep is not None:
        query = query.where(_job.c.sweep_id == sweep)
        count = count.where(_job.c.sweep_id == sweep)
    if status is not None:
        query = query.where(_job.c.status == status)
        count = count.where(_job.c.status == status)
    if owner is not None:
        query = query.where(_job.c.owner == owner)
        count = count.where(_job.c.owner == owner)
    rows = session.execute(query.order_by(_job.c.id.desc()).limit(limit).offset(offset))
    total = session.execute(count).scalar_one()
    return list(rows), int(total)


class Standing(NamedTuple):
    """Where a queued job stands: its place in the claim order, and its owner's quota."""

    position: int  # 1 = next to run
    behind_others: int  # jobs ahead of it that are other users' (fair share)
    running_devices: int  # what its owner's jobs hold now
    max_running_devices: int | None  # its owner's limit in force; None: none


def queue_position(session: Session, job: JobLike) -> int | None:
    """1-based place in the claim order of a queued job; None for any other status.

    The order is fair share's as it stands: every queued job of the users with less
    recent usage than its owner, then its owner's own ahead of it by priority and age.
    (As jobs run their owners' usage grows, so the place can change without a job
    starting.)"""
    if job.status != JobStatus.queued:
        return None
    return 1 + sum(_ahead(session, job))


def queue_standing(
    session: Session, job: JobLike, *, max_running_devices: int | None = None
) -> Standing | None:
    """``queue_position`` with what the waiting reason says about fair share and quota
    (``max_running_devices``: the settings' default limit)."""
    if job.status != JobStatus.queued:
        return None
    own, others = _ahead(session, job)
    held = running_devices(literal(job.owner))
    limit = select(_user.c.max_running_devices).where(_user.c.name == job.owner)
    running, own_limit = session.execute(select(held, limit.scalar_subquery())).one()
    limit_now = own_limit if own_limit is not None else max_running_devices
    return Standing(1 + own + others, others, int(running), limit_now)


def _ahead(session: Session, job: JobLike) -> tuple[int, int]:
    """Queued jobs ahead of ``job``: its owner's, and other users' (fair share), counted
    in one statement through the owners' indexes."""
    mine = _job.c.owner == job.owner
    # Without statistics SQLite would count through the status index (every queued job,
    # a table row each) rather than the owner's range; likely() tells it the status term
    # does not narrow.
    is_queued = func.likely(queued(_job)) if is_sqlite(session.get_bind()) else queued(_job)
    # Two index range counts (ix_job_owner_claim) for its owner's: one OR-ed condition
    # would scan their queue.
    higher = select(func.count()).where(mine, is_queued, _job.c.priority > job.priority)
    older = select(func.count()).where(
        mine, queued(_job), _job.c.priority == job.priority, _job.c.id < job.id
    )
    # Users served first: less usage, or as much and a name sorting first (the claim's
    # order, ix_user_usage), and every queued job of theirs (ix_job_owner_status).
    score = select(_user.c.usage_score).where(_user.c.name == job.owner).scalar_subquery()
    first = or_(
        _user.c.usage_score < score,
        and_(_user.c.usage_score == score, _user.c.name < job.owner),
    )
    # Summed over the users, each one's counted in its own range: a join would let SQLite
    # walk every queued job and look its owner up.
    each = select(func.count()).where(_job.c.owner == _user.c.name, is_queued)
    theirs = select(func.coalesce(func.sum(each.scalar_subquery()), 0)).where(first)
    own, others = session.execute(
        select(higher.scalar_subquery() + older.scalar_subquery(), theirs.scalar_subquery())
    ).one()
    return int(own), int(others)


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
