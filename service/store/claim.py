"""Taking a job and holding it: the claim, the attempt's start record, lease renewal.

The claim is one prebuilt statement (``_take_one``) and its SQL is all here: what a
queued job must meet to be taken (``_claimable``), the idle poll's look before it takes
(``_ANY_FITS``) and the count of what a worker could ever run (``_PENDING``).
"""

from __future__ import annotations

import secrets
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

from sqlalchemy import Engine, and_, bindparam, func, or_, select, update

from service.db import read_session, statement_connection, write_session
from service.jobspec import served_accelerators
from service.models import Job, JobStatus, Strategy, utcnow
from service.reasons import ReasonCode
from service.store.tables import job_table as _job
from service.store.tables import queued
from service.store.transitions import NEXT_STATUS, Fence, fenced


class Claim(NamedTuple):
    """A job a worker has just claimed: what it needs to start the attempt (the runner
    reads the rest of the spec itself)."""

    fence: Fence
    devices: int
    strategy: Strategy
    timeout_s: int | None
    script: bool = False  # runs the user's entrypoint, not a recipe
    gpu_memory_gb: float | None = None  # a share of one GPU, not whole ones


# The claim's SQL, built once. A claim runs these prebuilt statements with fresh
# parameters, which skips SQLAlchemy's statement construction.


def _claimable(job: Any, devices: str, room: str, *, runnable: bool = True) -> list[Any]:
    """What a queued job must meet for a worker to take it (``devices``, ``room``: the
    names of the params saying how many whole devices, and how many GiB on one GPU)."""
    where = [
        queued(job),
        # Whole devices, or a share of one GPU (gpu_memory_gb): never both, so a shared
        # GPU is never handed out whole, nor a whole one shared (the worker's room is 0
        # on a box without GPUs).
        or_(
            and_(job.c.gpu_memory_gb.is_(None), job.c.devices <= bindparam(devices)),
            job.c.gpu_memory_gb <= bindparam(room),
        ),
        job.c.accelerator.in_(bindparam("accelerators", expanding=True)),
        # a recipe this worker has, or a job that brings its own code
        or_(job.c.recipe.in_(bindparam("recipes", expanding=True)), job.c.code.is_not(None)),
    ]
    if runnable:  # not waiting out a retry back-off
        where.append(or_(job.c.run_after.is_(None), job.c.run_after <= bindparam("now")))
    return where


# What a claim reads back besides the fence (each column costs: ~40 of them made a
# third of a claim's time in the worker).
_CLAIM_SPEC = (
    _job.c.devices,
    _job.c.strategy,
    _job.c.timeout_s,
    _job.c.recipe.is_(None),
    _job.c.gpu_memory_gb,
)


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
        .where(*_claimable(oldest, "total", "gpu_total"))
        .order_by(oldest.c.id)
        .limit(1)
        .subquery("first")
    )
    starving = select(first.c.id).where(first.c.created_at < bindparam("starve_before"))
    target = (
        select(candidate.c.id)
        .where(
            *_claimable(candidate, "free", "gpu_room"),
            candidate.c.id == func.coalesce(starving.scalar_subquery(), candidate.c.id),
        )
        .order_by(candidate.c.priority.desc(), candidate.c.id)
        .limit(1)
        .with_for_update(skip_locked=True)
        .scalar_subquery()
    )
    # The one status it may come from, ALLOWED_FROM[running], spelled as the partial
    # indexes' literal (a test checks that the two agree).
    return (
        update(_job)
        .where(_job.c.id == target, queued(_job))
        .values(
            status=JobStatus.running,
            worker_id=bindparam("worker"),
            lease_token=bindparam("token"),
            lease_expires_at=bindparam("expires"),
            started_at=bindparam("now"),
            finished_at=None,
            progress=None,
            reason_code=ReasonCode.running,
            reason_message=bindparam("message"),
            **NEXT_STATUS,
        )
        .returning(_job.c.id, _job.c.attempt, _job.c.lease_token, *_CLAIM_SPEC)
    )


_TAKE = _take_one()
# An idle worker's poll mostly finds nothing: it looks (no lock) before it takes one.
_ANY_FITS = select(_job.c.id).where(*_claimable(_job, "free", "gpu_room")).limit(1)
_PENDING = (
    select(func.count())
    .select_from(_job)
    .where(*_claimable(_job, "total", "gpu_total", runnable=False))
)
# Before any job could have waited this long: nothing counts as starving.
_NEVER = datetime(1970, 1, 1, tzinfo=UTC)


def claim_job(
    engine: Engine,
    *,
    worker_id: str,
    free_devices: int,
    total_devices: int | None = None,
    gpu_room_gb: float = 0.0,
    gpu_total_gb: float = 0.0,
    accelerator: str,
    recipes: list[str],
    lease_s: float,
    reserve_after_s: float | None = None,
    peek: bool = False,
) -> Claim | None:
    """Atomically take the best queued job that fits, or None. Exactly one worker wins.

    A job fits in ``free_devices`` whole devices, or, asking for a share of one GPU, in
    ``gpu_room_gb`` (the most GiB a share could have on one of this worker's GPUs now;
    ``gpu_total_gb``: on its largest GPU, idle).

    Best is highest priority, then oldest; a smaller job may overtake one that does not
    fit yet, unless that one has waited ``reserve_after_s``: then nothing else is claimed
    here until enough devices are free for it, so a large job cannot starve.
    """
    if free_devices < 1 and gpu_room_gb <= 0:
        return None
    now = utcnow()
    params = {
        "free": free_devices,
        "total": total_devices or free_devices,
        "gpu_room": gpu_room_gb,
        "gpu_total": gpu_total_gb or gpu_room_gb,
        "accelerators": served_accelerators(accelerator),
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
    job_id, attempt, token, devices, strategy, timeout_s, script, share = row
    return Claim(Fence(job_id, attempt, token), devices, strategy, timeout_s, bool(script), share)


def pending_count(
    engine: Engine,
    *,
    max_devices: int,
    accelerator: str,
    recipes: list[str],
    gpu_total_gb: float = 0.0,
) -> int:
    """Queued jobs this worker could ever run, including ones waiting out a retry back-off."""
    params = {
        "total": max_devices,
        "gpu_total": gpu_total_gb,
        "accelerators": served_accelerators(accelerator),
        "recipes": recipes,
    }
    with read_session(engine) as session:
        return int(session.execute(_PENDING, params).scalar_one())


def record_start(engine: Engine, fence: Fence, *, devices: list[int], pgid: int) -> bool:
    """Note which devices and process group an attempt holds (for kill and crash recovery)."""
    with write_session(engine) as session:
        result = session.exec(
            update(Job).where(*fenced(fence)).values(assigned_devices=devices, runner_pgid=pgid)
        )
        return bool(result.rowcount == 1)


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
                .where(*fenced(fence))
                .values(lease_expires_at=expires)
                .returning(Job.status, Job.progress)
            ).first()
            if row is not None:
                status, progress = row
                held[fence.job_id] = Held(JobStatus(status), (progress or {}).get("step"))
    return held
