"""The job store: the one place that changes a job's status.

Every transition is a conditional UPDATE whose WHERE clause names the statuses it may
come from (``ALLOWED_FROM``) and, for writes by a worker, the fence
``(job id, attempt, lease token)``. A write whose condition no longer holds changes
nothing and reports so; nothing is read, decided in Python, then written back.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

from sqlalchemy import Engine, Row, bindparam, func, insert, literal_column, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col

from service.db import is_sqlite, read_session, statement_connection, write_session
from service.errors import IdempotencyConflict, InvalidTransition, JobNotFound
from service.group_commit import Values, committer
from service.models import (
    Accelerator,
    Job,
    JobCreate,
    JobLike,
    JobStatus,
    LogLine,
    Metric,
    Strategy,
    utcnow,
)
from service.wakeup import announce_job

S = JobStatus
# target status -> the statuses a job may reach it from
ALLOWED_FROM: dict[JobStatus, frozenset[JobStatus]] = {
    S.running: frozenset({S.queued}),  # claim
    S.cancelling: frozenset({S.running}),  # cancel while a worker trains it
    S.queued: frozenset({S.running}),  # retry, or the worker was lost
    S.succeeded: frozenset({S.running, S.cancelling}),  # finished before the cancel landed
    S.failed: frozenset({S.running, S.cancelling}),
    S.cancelled: frozenset({S.queued, S.cancelling}),
}
ACTIVE = (S.running, S.cancelling)
_job = Job.__table__  # type: ignore[attr-defined]  # the tables, for Core statements
_log = LogLine.__table__  # type: ignore[attr-defined]
# Prebuilt INSERT ... RETURNING: no unit-of-work flush and refresh, no per-call statement
# construction (a submit's database work drops from ~1 ms to a third of that).
_INSERT_MANY = insert(_job).returning(*_job.c, sort_by_parameter_order=True)

# Back-off before a failed attempt runs again: 1 s, 2 s, 4 s ... capped.
RETRY_BACKOFF_BASE_S = 1.0
RETRY_BACKOFF_MAX_S = 60.0


@dataclass(frozen=True)
class Fence:
    """Proof that a worker still owns an attempt; every worker write carries one."""

    job_id: int
    attempt: int
    lease_token: str


def _fenced(fence: Fence) -> list[Any]:
    """The attempt still owns the job: same attempt and token, and the lease has not run
    out (once it has, nothing the attempt does can count, even before anyone requeues)."""
    return [
        Job.id == fence.job_id,
        Job.attempt == fence.attempt,
        Job.lease_token == fence.lease_token,
        col(Job.status).in_(ACTIVE),
        col(Job.lease_expires_at) > utcnow(),
    ]


class Claim(NamedTuple):
    """A job a worker has just claimed: what it needs to start the attempt (the runner
    reads the rest of the spec itself)."""

    fence: Fence
    devices: int
    strategy: Strategy
    timeout_s: int | None


def _lease_ended(code: str, message: str, **more: Any) -> dict[str, Any]:
    """Values that end an attempt's hold on a job, with the reason why."""
    return {
        "reason_code": code,
        "reason_message": message,
        "lease_token": None,
        "lease_expires_at": None,
        "runner_pgid": None,
        **more,
    }


# A status change takes the job's next event number (see Job.event_seq).
_NEXT_STATUS = {"event_seq": _job.c.event_seq + 1, "status_seq": _job.c.event_seq + 1}


def _transition(
    session: Session, job_id: int, to: JobStatus, *where: Any, **values: Any
) -> Job | None:
    """Move one job to ``to`` if it is in an allowed status and ``where`` holds."""
    stmt = (
        update(Job)
        .where(Job.id == job_id, col(Job.status).in_(ALLOWED_FROM[to]), *where)
        .values(status=to, **_NEXT_STATUS, **values)
        .returning(Job)
        .execution_options(synchronize_session=False, populate_existing=True)
    )
    job = session.exec(stmt).scalar_one_or_none()
    if job is not None and to == S.queued:
        announce_job(session)  # a retry or a job handed back: claimable again
    return job


# --- submit, read, cancel (API side) -------------------------------------------------


def create_job(
    engine: Engine,
    spec: JobCreate,
    *,
    idempotency_key: str | None = None,
    reason: tuple[str, str] = ("queued", "waiting for a worker"),
) -> tuple[Job, bool]:
    """Enqueue a validated spec; returns (job, created). A repeated key returns the first job."""
    try:
        return _create_job(engine, spec, idempotency_key, reason)
    except IntegrityError:
        if idempotency_key is None:
            raise
        # Two submits with one key at once (PostgreSQL: neither saw the other's row): the
        # unique index let one in; the other now finds it.
        return _create_job(engine, spec, idempotency_key, reason)


async def enqueue_job(
    engine: Engine, spec: JobCreate, reason: tuple[str, str] = ("queued", "waiting for a worker")
) -> Row[Any]:
    """``create_job`` without an idempotency key, awaited on an event loop: the row joins
    the group committer's next batch, and the request holds no thread while it waits.
    Returns the row as inserted (its columns as attributes; ``JobRead.from_row`` reads it)."""
    return await asyncio.wrap_future(committer(engine, _insert_jobs).enqueue(_row(spec, reason)))


def _row(spec: JobCreate, reason: tuple[str, str], idempotency_key: str | None = None) -> Values:
    """The job row to insert for a validated spec: its fields, then ``Job``'s defaults for
    the rest. A dict, not a ``Job``: building one costs ~0.13 ms of SQLAlchemy's attribute
    instrumentation, a sixth of a submit's time."""
    row = spec.model_dump()
    for name, field in _NEW_JOB_FIELDS.items():
        row[name] = field.get_default(call_default_factory=True)
    row.update(idempotency_key=idempotency_key, reason_code=reason[0], reason_message=reason[1])
    return row


# The columns a new job has beyond its spec (the database numbers ``id``).
_NEW_JOB_FIELDS = {
    name: field
    for name, field in Job.model_fields.items()
    if name != "id" and name not in JobCreate.model_fields
}


def _create_job(
    engine: Engine, spec: JobCreate, idempotency_key: str | None, reason: tuple[str, str]
) -> tuple[Job, bool]:
    row = _row(spec, reason, idempotency_key)
    if idempotency_key is None:  # the common case: batched with concurrent submits
        return Job(**committer(engine, _insert_jobs).submit(row)._mapping), True
    with write_session(engine) as session:
        existing = session.exec(
            select(Job).where(Job.idempotency_key == idempotency_key)
        ).scalar_one_or_none()
        if existing is not None:
            if spec_of(existing) != spec:
                raise IdempotencyConflict(
                    f"Idempotency-Key {idempotency_key!r} was used for a different job "
                    f"({existing.id})"
                )
            return existing, False
        return Job(**_insert_jobs(session, [row])[0]._mapping), True


def _insert_jobs(session: Session, rows: list[Values]) -> list[Row[Any]]:
    """INSERT the rows (one transaction, the caller's) and wake idle workers once."""
    # one multi-row INSERT ... RETURNING, rows back in the order given; plain rows, not
    # Job objects, which cost ~0.14 ms each of this one writer thread's time
    inserted = list(session.execute(_INSERT_MANY, rows))
    announce_job(session)
    return inserted


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
    if job.status != S.queued:
        return None
    # Two index range counts (ix_job_claim), in one statement: one OR-ed condition would
    # scan the queue.
    queued = _queued(_job)
    if is_sqlite(session.get_bind()):
        # Without statistics SQLite would count "priority > p" through the status index
        # (every queued job, a table row each: ~5 ms at 30,000 queued) rather than the
        # claim index's range; likely() tells it the status term does not narrow.
        queued = func.likely(queued)
    higher = select(func.count()).where(queued, _job.c.priority > job.priority)
    older = select(func.count()).where(
        _queued(_job), _job.c.priority == job.priority, _job.c.id < job.id
    )
    ahead = session.execute(select(higher.scalar_subquery() + older.scalar_subquery()))
    return int(ahead.scalar_one()) + 1


def cancel_job(engine: Engine, job_id: int) -> Job:
    """Queued -> cancelled now; running -> cancelling (the worker stops it). Idempotent."""
    now = utcnow()
    with write_session(engine) as session:
        # Locked (PostgreSQL): a worker cannot finish or claim it between read and write.
        job = session.get(Job, job_id, with_for_update=True)
        if job is None:
            raise JobNotFound(job_id)
        if job.status in (S.cancelling, S.cancelled):
            return job
        if job.status in (S.succeeded, S.failed):
            raise InvalidTransition(f"job {job_id} already {job.status}; nothing to cancel")
        if job.status == S.queued:
            done = _transition(
                session,
                job_id,
                S.cancelled,
                finished_at=now,
                reason_code="cancelled",
                reason_message="cancelled before it started",
            )
        else:
            done = _transition(
                session,
                job_id,
                S.cancelling,
                reason_code="cancelling",
                reason_message="cancel requested; stopping the job",
            )
        assert done is not None, "status changed under the row lock / IMMEDIATE transaction"
        return done


# --- claim, heartbeat, report, finish (worker side) -----------------------------------


# The claim's SQL, built once. A claim runs these prebuilt statements with fresh
# parameters, which skips SQLAlchemy's statement construction.


def _queued(job: Any) -> Any:
    """``status = 'queued'`` as a literal, the text the queue's partial indexes match."""
    return job.c.status == literal_column(f"'{S.queued.value}'")


def _claimable(job: Any, devices: str, *, runnable: bool = True) -> list[Any]:
    """What a queued job must meet for a worker to take it (``devices``: the param name)."""
    where = [
        _queued(job),
        job.c.devices <= bindparam(devices),
        job.c.accelerator.in_(bindparam("accelerators", expanding=True)),
        job.c.recipe.in_(bindparam("recipes", expanding=True)),
    ]
    if runnable:  # not waiting out a retry back-off
        where.append(or_(job.c.run_after.is_(None), job.c.run_after <= bindparam("now")))
    return where


# What a claim reads back besides the fence (each column costs: ~40 of them made a
# third of a claim's time in the worker).
_CLAIM_SPEC = (_job.c.devices, _job.c.strategy, _job.c.timeout_s)


def _take_one() -> Any:
    """The claim as one statement: UPDATE the best queued job that fits, if still queued.

    Best is highest priority, then oldest. But when the job that has waited longest (the
    oldest: ids grow with time) was created before ``starve_before``, only it may be taken:
    if it does not fit the free devices, nothing is, and they stay free until it does.
    FOR UPDATE SKIP LOCKED (PostgreSQL) passes over a row another worker is claiming
    instead of queueing behind it; SQLite has no such clause and needs none, since its
    IMMEDIATE transaction runs one claim at a time.
    """
    candidate, oldest = _job.alias("candidate"), _job.alias("oldest")
    first = (
        select(oldest.c.id, oldest.c.created_at)
        .where(*_claimable(oldest, "total"))
        .order_by(oldest.c.id)
        .limit(1)
        .subquery("first")
    )
    starving = select(first.c.id).where(first.c.created_at < bindparam("starve_before"))
    target = (
        select(candidate.c.id)
        .where(
            *_claimable(candidate, "free"),
            candidate.c.id == func.coalesce(starving.scalar_subquery(), candidate.c.id),
        )
        .order_by(candidate.c.priority.desc(), candidate.c.id)
        .limit(1)
        .with_for_update(skip_locked=True)
        .scalar_subquery()
    )
    return (
        update(_job)
        .where(_job.c.id == target, _queued(_job))
        .values(
            status=S.running,
            worker_id=bindparam("worker"),
            lease_token=bindparam("token"),
            lease_expires_at=bindparam("expires"),
            started_at=bindparam("now"),
            finished_at=None,
            progress=None,
            reason_code="running",
            reason_message=bindparam("message"),
            **_NEXT_STATUS,
        )
        .returning(_job.c.id, _job.c.attempt, _job.c.lease_token, *_CLAIM_SPEC)
    )


_TAKE = _take_one()
# An idle worker's poll mostly finds nothing: it looks (no lock) before it takes one.
_ANY_FITS = select(_job.c.id).where(*_claimable(_job, "free")).limit(1)
_PENDING = select(func.count()).select_from(_job).where(*_claimable(_job, "total", runnable=False))
# Before any job could have waited this long: nothing counts as starving.
_NEVER = datetime(1970, 1, 1, tzinfo=UTC)


def _accelerators(accelerator: str) -> list[Accelerator]:
    """Job accelerators a worker with ``accelerator`` devices can serve."""
    if accelerator == "cuda":
        return [Accelerator.auto, Accelerator.cpu, Accelerator.cuda]
    return [Accelerator.auto, Accelerator.cpu]


def claim_job(
    engine: Engine,
    *,
    worker_id: str,
    free_devices: int,
    total_devices: int | None = None,
    accelerator: str,
    recipes: list[str],
    lease_s: float,
    reserve_after_s: float | None = None,
    peek: bool = False,
) -> Claim | None:
    """Atomically take the best queued job that fits, or None. Exactly one worker wins.

    Best is highest priority, then oldest; a smaller job may overtake one that does not
    fit yet, unless that one has waited ``reserve_after_s``: then nothing else is claimed
    here until enough devices are free for it, so a large job cannot starve.
    """
    if free_devices < 1 or not recipes:
        return None
    now = utcnow()
    params = {
        "free": free_devices,
        "total": total_devices or free_devices,
        "accelerators": _accelerators(accelerator),
        "recipes": recipes,
        "now": now,
    }
    if peek:
        with engine.connect() as conn:
            if conn.execute(_ANY_FITS, params).first() is None:
                return None
    starve_before = _NEVER if reserve_after_s is None else now - timedelta(seconds=reserve_after_s)
    with statement_connection(engine) as conn:  # Core: an ORM session costs ~0.3 ms here
        row = conn.execute(
            _TAKE,
            {
                **params,
                "starve_before": starve_before,
                "worker": worker_id,
                "token": secrets.token_hex(16),
                "expires": now + timedelta(seconds=lease_s),
                "message": f"attempt running on {worker_id}",
            },
        ).one_or_none()  # exactly one row, or none: WHERE id = one id AND still queued
    if row is None:
        return None
    job_id, attempt, token, *spec = row
    return Claim(Fence(job_id, attempt, token), *spec)


def pending_count(engine: Engine, *, max_devices: int, accelerator: str, recipes: list[str]) -> int:
    """Queued jobs this worker could ever run, including ones waiting out a retry back-off."""
    params = {"total": max_devices, "accelerators": _accelerators(accelerator), "recipes": recipes}
    with read_session(engine) as session:
        return int(session.execute(_PENDING, params).scalar_one())


def record_start(engine: Engine, fence: Fence, *, devices: list[int], pgid: int) -> bool:
    """Note which devices and process group an attempt holds (for kill and crash recovery)."""
    with write_session(engine) as session:
        result = session.exec(
            update(Job).where(*_fenced(fence)).values(assigned_devices=devices, runner_pgid=pgid)
        )
        return bool(result.rowcount == 1)


def record_environment(engine: Engine, fence: Fence, environment: dict[str, Any]) -> bool:
    """Store an attempt's reproducibility record on the job (fenced)."""
    with write_session(engine) as session:
        result = session.execute(update(Job).where(*_fenced(fence)).values(environment=environment))
        return bool(result.rowcount == 1)  # type: ignore[attr-defined]


class Held(NamedTuple):
    """A lease still held, with what the worker needs to act on: cancel, stalled steps."""

    status: JobStatus
    step: int | None


def renew_lease(engine: Engine, fences: list[Fence], lease_s: float) -> dict[int, Held]:
    """Extend the leases still held; returns job id -> Held for those (lost ones are absent)."""
    if not fences:
        return {}
    expires = utcnow() + timedelta(seconds=lease_s)
    held: dict[int, Held] = {}
    with write_session(engine) as session:
        for fence in fences:
            row = session.exec(
                update(Job)
                .where(*_fenced(fence))
                .values(lease_expires_at=expires)
                .returning(Job.status, Job.progress)
            ).first()
            if row is not None:
                status, progress = row
                held[fence.job_id] = Held(JobStatus(status), (progress or {}).get("step"))
    return held


def report(
    engine: Engine,
    fence: Fence,
    *,
    progress: dict[str, Any] | None = None,
    metrics: Sequence[dict[str, Any]] = (),
) -> bool:
    """Write progress and metric points of a running attempt in one transaction (fenced)."""
    taken = len(metrics) + (progress is not None)
    if not taken:
        return True
    values: dict[str, Any] = {"event_seq": _job.c.event_seq + taken}
    if progress is not None:  # progress takes the last number, after the points it sums up
        values |= {"progress": progress, "progress_seq": _job.c.event_seq + taken}
    with write_session(engine) as session:
        last = session.execute(
            update(_job).where(*_fenced(fence)).values(**values).returning(_job.c.event_seq)
        ).scalar_one_or_none()
        if last is None:
            return False
        if metrics:
            # executemany of one prebuilt statement: the driver loops in C. A multi-row
            # VALUES statement would be compiled anew for every batch size.
            first = last - taken + 1
            rows = [{"job_id": fence.job_id, "seq": first + i, **m} for i, m in enumerate(metrics)]
            session.execute(_INSERT_METRIC[engine.dialect.name], rows)
        return True


def append_logs(
    engine: Engine, fence: Fence, lines: list[tuple[float, str, str]], *, max_lines: int
) -> bool:
    """Append (time, stream, text) lines with the job's next event numbers (fenced).

    A job keeps at most ``max_lines`` lines: its first half, and the newest lines after a
    marker that counts the lines dropped between them, so the lines printed just before a
    crash or a cancel are always kept.
    """
    if not lines:
        return True
    n = len(lines)
    with write_session(engine) as session:
        row = session.execute(
            update(_job)
            .where(*_fenced(fence))
            .values(event_seq=_job.c.event_seq + n, log_count=_job.c.log_count + n)
            .returning(_job.c.event_seq, _job.c.log_count, _job.c.log_marker_seq)
        ).one_or_none()
        if row is None:
            return False
        first = row.event_seq - n + 1
        session.execute(
            _INSERT_LOG,
            [
                {"job_id": fence.job_id, "seq": first + i, "time": t, "stream": s, "text": x}
                for i, (t, s, x) in enumerate(lines)
            ],
        )
        if row.log_count > max_lines:
            _drop_middle_lines(session, fence.job_id, row.log_count, max_lines, row.log_marker_seq)
        return True


def _drop_middle_lines(
    session: Session, job_id: int, count: int, max_lines: int, marker: int | None
) -> None:
    """Bring a job from ``count`` lines back to ``max_lines`` by deleting the oldest lines
    after its kept head; the marker line (the first after the head) counts what was dropped."""
    replaced = 0
    if marker is None:  # the first drop: the line after the head becomes the marker
        marker = session.execute(
            select(_log.c.seq)
            .where(_log.c.job_id == job_id)
            .order_by(_log.c.seq)
            .offset(max_lines // 2)
            .limit(1)
        ).scalar_one()
        replaced = 1  # its own text gives way to the notice
    doomed = (
        select(_log.c.seq)
        .where(_log.c.job_id == job_id, _log.c.seq > marker)
        .order_by(_log.c.seq)
        .limit(count - max_lines)
        .scalar_subquery()
    )
    deleted = session.execute(
        _log.delete().where(_log.c.job_id == job_id, _log.c.seq.in_(doomed))
    ).rowcount  # type: ignore[attr-defined]
    dropped = session.execute(
        update(_job)
        .where(_job.c.id == job_id)
        .values(
            log_count=_job.c.log_count - deleted,
            log_dropped=_job.c.log_dropped + deleted + replaced,
            log_marker_seq=marker,
        )
        .returning(_job.c.log_dropped)
    ).scalar_one()
    session.execute(
        update(_log)
        .where(_log.c.job_id == job_id, _log.c.seq == marker)
        .values(
            stream="system",
            text=f"[trainyard] {dropped} line(s) dropped here: the job printed more than "
            f"{max_lines} lines (TRAINYARD_MAX_LOG_LINES); its first and latest are kept",
        )
    )


@dataclass(frozen=True)
class Outcome:
    """How an attempt ended, as the worker saw it."""

    status: JobStatus  # succeeded, failed or cancelled
    reason_code: str
    reason_message: str
    error: dict[str, Any] | None = None
    result: dict[str, Any] | None = None
    retryable: bool = False


def finish_attempt(engine: Engine, fence: Fence, outcome: Outcome) -> Job | None:
    """End an attempt: final status, or back to queued when it failed and may be retried."""
    now = utcnow()
    with write_session(engine) as session:
        job = session.exec(
            select(Job).where(*_fenced(fence)).with_for_update()
        ).scalar_one_or_none()
        if job is None:
            return None  # the lease was lost; the job is someone else's now
        common = _lease_ended(outcome.reason_code, outcome.reason_message)
        if job.status == S.cancelling and outcome.status != S.succeeded:
            return _transition(
                session,
                job.id,
                S.cancelled,
                finished_at=now,
                error=outcome.error,
                **_lease_ended("cancelled", "cancelled while running"),
            )
        if outcome.status == S.failed and outcome.retryable and job.attempt < job.max_attempts:
            return _requeue(session, job, now, common, error=outcome.error)
        target = S.failed if outcome.status == S.cancelled else outcome.status
        return _transition(
            session,
            job.id,
            target,
            *_fenced(fence),
            finished_at=now,
            error=outcome.error,
            result=outcome.result,
            **common,
        )


def _requeue(
    session: Session,
    job: Job,
    now: datetime,
    common: dict[str, Any],
    *,
    back_off: bool = True,
    **values: Any,
) -> Job | None:
    """Queue the next attempt; after a back-off when the job itself failed."""
    assert job.id is not None
    delay = min(RETRY_BACKOFF_BASE_S * 2 ** (job.attempt - 1), RETRY_BACKOFF_MAX_S)
    delay = delay if back_off else 0.0
    message = f"{common['reason_message']} (attempt {job.attempt} of {job.max_attempts}; retrying)"
    return _transition(
        session,
        job.id,
        S.queued,
        Job.attempt == job.attempt,
        **{**common, "reason_message": message},
        attempt=job.attempt + 1,
        worker_id=None,
        assigned_devices=None,
        run_after=now + timedelta(seconds=delay),
        **values,
    )


def release_attempt(engine: Engine, fence: Fence, reason_code: str, message: str) -> Job | None:
    """Give a running job back to the queue without spending an attempt (worker shutdown)."""
    now = utcnow()
    off_worker = {"worker_id": None, "assigned_devices": None}
    with write_session(engine) as session:
        done = _transition(
            session,
            fence.job_id,
            S.queued,
            *_fenced(fence),
            run_after=None,
            **_lease_ended(reason_code, message, **off_worker),
        )
        if done is None:  # cancel asked meanwhile: honour it rather than requeue
            done = _transition(
                session,
                fence.job_id,
                S.cancelled,
                *_fenced(fence),
                finished_at=now,
                **_lease_ended("cancelled", "cancelled while running", **off_worker),
            )
        return done


def expire_leases(engine: Engine) -> list[int]:
    """Requeue (or end) jobs whose worker stopped renewing its lease; returns their ids."""
    return _abandon(
        engine,
        [col(Job.lease_expires_at) < utcnow()],
        "worker_lost",
        "worker {worker} stopped renewing its lease",
    )


def abandon_worker_jobs(engine: Engine, worker_id: str) -> list[int]:
    """Requeue the jobs a worker held before it restarted (its processes are already killed)."""
    return _abandon(
        engine,
        [Job.worker_id == worker_id],
        "worker_restarted",
        "worker {worker} restarted while running the job",
    )


def _abandon(engine: Engine, where: list[Any], code: str, message: str) -> list[int]:
    """Active jobs matching ``where`` lose their attempt: retried if they may be, else ended."""
    now = utcnow()
    changed: list[int] = []
    with write_session(engine) as session:
        # SKIP LOCKED (PostgreSQL): a job whose row another session holds is that session's
        # business now; the next pass sees it again.
        query = select(Job).where(col(Job.status).in_(ACTIVE), *where)
        jobs = session.exec(query.with_for_update(skip_locked=True)).scalars().all()
        for job in jobs:
            common = _lease_ended(code, message.format(worker=job.worker_id))
            if job.status == S.cancelling:
                done = _transition(session, job.id, S.cancelled, finished_at=now, **common)
            elif job.attempt < job.max_attempts:
                # the worker failed, not the job: no reason to wait before the next attempt
                done = _requeue(session, job, now, common, back_off=False)
            else:
                done = _transition(session, job.id, S.failed, finished_at=now, **common)
            if done is not None:
                changed.append(job.id)
    return changed


def active_jobs_of(engine: Engine, worker_id: str) -> list[Job]:
    """Jobs a worker holds (running or cancelling)."""
    with read_session(engine) as session:
        query = select(Job).where(col(Job.status).in_(ACTIVE), Job.worker_id == worker_id)
        return list(session.exec(query).scalars())


# INSERT that skips points whose (job, name, step) exists: a resumed run re-reports some.
_INSERT_LOG = insert(_log)
_INSERT_METRIC = {
    "sqlite": sqlite.insert(Metric.__table__).on_conflict_do_nothing(),  # type: ignore[attr-defined]
    "postgresql": postgresql.insert(Metric.__table__).on_conflict_do_nothing(),  # type: ignore[attr-defined]
}


def load_job(engine: Engine, job_id: int) -> Job:
    """Load a job outside any request (worker and runner side)."""
    with read_session(engine) as session:
        job = session.get(Job, job_id)
    if job is None:
        raise JobNotFound(job_id)
    return job
