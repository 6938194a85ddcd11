"""Taking a job and holding it: the claim, the attempt's start record, lease renewal.

The claim is one prebuilt statement (``_take_one``) and its SQL is all here: what a
queued job must meet to be taken (``_claimable``), a user's best job (``_best_of``), the
walk over the users in fair share's order (``_first_user``), the idle poll's look before
it takes (``_any_fits``) and the count of what a worker could ever run (``_pending``).
They are kept in one module past ~300 lines because each is a piece of that one
statement: split, the claim's SQL would be read across files.
"""

from __future__ import annotations

import functools
import secrets
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

from sqlalchemy import Engine, and_, bindparam, case, exists, func, or_, select, tuple_, update

from service.db import read_session, statement_connection, write_session
from service.jobspec import served_accelerators
from service.models import BOOTSTRAP_USER, Job, JobStatus, Strategy, utcnow
from service.reasons import ReasonCode
from service.store.tables import job_table as _job
from service.store.tables import node_table as _node
from service.store.tables import queued
from service.store.transitions import ACTIVE, NEXT_STATUS, Fence, fenced
from service.store.usage import quota_limit, running_devices
from service.store.usage import user_table as _user


class Claim(NamedTuple):
    """A job a worker has just claimed: what it needs to start the attempt (the runner
    reads the rest of the spec itself)."""

    fence: Fence
    devices: int
    strategy: Strategy
    timeout_s: int | None
    script: bool = False  # runs the user's entrypoint, not a recipe
    gpu_memory_gb: float | None = None  # a share of one GPU, not whole ones
    owner: str = BOOTSTRAP_USER  # the user charged for its devices (fair share)


# The claim's SQL, built once. A claim runs these prebuilt statements with fresh
# parameters, which skips SQLAlchemy's statement construction.


# How many accelerators and recipes a worker offers, and whether it takes jobs across
# nodes (a Slurm worker): each such shape has its statements built once, with a parameter
# per item. (Expanding IN parameters, rewritten into the SQL at every execution, took a
# sixth of a claim's time in Python.)
Shape = tuple[int, int, bool]


def _shape_params(
    accelerators: list[str], recipes: list[str], *, across: bool = False
) -> tuple[Shape, dict[str, str]]:
    """The shape of a worker's offer, and its items as the statements' parameters."""
    params = {f"accelerator_{i}": a for i, a in enumerate(accelerators)}
    params.update({f"recipe_{i}": r for i, r in enumerate(recipes)})
    return (len(accelerators), len(recipes), across), params


def _claimable(
    job: Any, devices: str, room: str, shape: Shape, *, runnable: bool = True
) -> list[Any]:
    """What a queued job must meet for a worker to take it (``devices``, ``room``: the
    names of the params saying how many whole devices, and how many GiB on one GPU;
    ``shape``: how many accelerators and recipes the worker offers)."""
    accelerators: list[Any] = [bindparam(f"accelerator_{i}") for i in range(shape[0])]
    recipes: list[Any] = [bindparam(f"recipe_{i}") for i in range(shape[1])]
    where = [
        queued(job),
        # A box's worker takes one-node jobs (a job across boxes starts when its gang is
        # whole: gang.py); a Slurm worker takes jobs across up to its cluster's nodes,
        # but not one whose gang boxes' workers have begun to form (sharing one queue).
        *(
            [
                job.c.nodes <= bindparam("max_nodes"),
                or_(job.c.nodes == 1, ~exists().where(_node.c.job_id == job.c.id)),
            ]
            if shape[2]
            else [job.c.nodes == 1]
        ),
        # Whole devices, or a share of one GPU (gpu_memory_gb): never both, so a shared
        # GPU is never handed out whole, nor a whole one shared (the worker's room is 0
        # on a box without GPUs).
        or_(
            and_(job.c.gpu_memory_gb.is_(None), job.c.devices <= bindparam(devices)),
            job.c.gpu_memory_gb <= bindparam(room),
        ),
        job.c.accelerator.in_(accelerators),
        # a recipe this worker has, or a job that brings its own code
        or_(job.c.recipe.in_(recipes), job.c.code.is_not(None)),
    ]
    if runnable:  # not waiting out a retry back-off
        where.append(or_(job.c.run_after.is_(None), job.c.run_after <= bindparam("now")))
    return where


# What a claim reads back: the fence, and the spec the worker needs to start it (each
# column costs: ~40 of them made a third of a claim's time in the worker).
CLAIM_COLUMNS = (
    _job.c.id,
    _job.c.attempt,
    _job.c.lease_token,
    _job.c.devices,
    _job.c.strategy,
    _job.c.timeout_s,
    _job.c.recipe.is_(None),
    _job.c.gpu_memory_gb,
    _job.c.owner,
)


def claim_of(row: Any) -> Claim:
    """The ``Claim`` a row of ``CLAIM_COLUMNS`` says."""
    job_id, attempt, token, devices, strategy, timeout_s, script, share, owner = row
    fence = Fence(job_id, attempt, token)
    return Claim(fence, devices, Strategy(strategy), timeout_s, bool(script), share, owner)


def _best_of(
    user: Any,
    name: str,
    devices: str,
    room: str,
    shape: Shape,
    also: Callable[[Any], Any] | None = None,
    *,
    oldest: bool = False,
) -> Any:
    """SQL: ``user``'s best queued job that fits (highest priority, then oldest; with
    ``oldest``, oldest) within their running quota, or NULL: one probe of
    ix_job_owner_claim (of ix_job_owner_status by id), correlated to ``user`` (``also``:
    a further condition on the job)."""
    job = _job.alias(name)
    limit = quota_limit(user)
    order = (job.c.id,) if oldest else (job.c.priority.desc(), job.c.id)
    return (
        select(job.c.id)
        .where(
            job.c.owner == user.c.name,
            *_claimable(job, devices, room, shape),
            # The running quota: what the user's jobs hold now, and this job (on each
            # of its nodes), within it.
            or_(
                limit.is_(None),
                job.c.devices * job.c.nodes <= limit - running_devices(user.c.name),
            ),
            *([] if also is None else [also(job)]),
        )
        .order_by(*order)
        .limit(1)
        .correlate_except(job)
    )


# A bound on the users a claim walks that no box reaches (the subquery needs a LIMIT).
_ALL_USERS = 1_000_000


def _first_user(name: str, best_of: Callable[[Any], Any]) -> Any:
    """SQL: the best job (``best_of(user)``, a probe correlated to the user) of the first
    user, least usage first, who has one that fits.

    The users are read in ix_user_usage's order, each probed once, in a subquery whose
    LIMIT keeps the planners from merging it into the query that takes its first
    non-NULL probe (SQLite would otherwise probe every user and then sort, or probe the
    one it picks twice); usually the first user has a job. A user already at their
    running quota is passed over unprobed (else the probe would walk their backlog)."""
    user = _user.alias(name)
    limit = quota_limit(user)
    has_room = or_(limit.is_(None), running_devices(user.c.name) < limit)
    probes = (
        select(best_of(user).label("job_id"))
        .where(has_room)
        .order_by(user.c.usage_score, user.c.name)
        .limit(_ALL_USERS)
        .subquery(f"{name}_probes")
    )
    # No ORDER BY here: the rows come in the subquery's order (both databases read a
    # subquery they cannot merge in its order, and the fair-share tests check it on both).
    return select(probes.c.job_id).where(probes.c.job_id.is_not(None)).limit(1).scalar_subquery()


@functools.cache
def _take_one(shape: Shape) -> Any:
    """The claim as one statement: UPDATE the best queued job that fits, if still queued.

    Best is fair share's: the job of the user with the least recent usage
    (``trainyard_user.usage_score``, see service.fair_share) who has one that fits within
    their running quota; among theirs, highest priority, then oldest. But when the oldest
    job of the user fair share would serve first on an idle worker (the head user: the
    first with a job that fits the worker's ``total``) was created before
    ``starve_before``, only it may be taken: if it does not fit the free devices, nothing
    is, and they stay free until it does. (The reservation is the head user's, not the
    whole queue's oldest: a heavy user's backlog, however old, does not jump the order.)

    FOR UPDATE SKIP LOCKED (PostgreSQL) passes over a job row another worker is claiming
    instead of queueing behind it (it locks the job row the probe returns, not the
    user's); SQLite has no such clause and needs none, since its IMMEDIATE transaction
    runs one claim at a time. On PostgreSQL two claims at the same instant may each see
    the other's job as not yet running: together they can pass a user's running quota,
    by a job each, until the next claim counts them.
    """
    # The user fair share serves first on an idle worker (the head: the first with a job
    # that fits the worker's ``total``) ...
    head = _first_user(
        "head_user",
        lambda user: _best_of(user, "head", "total", "gpu_total", shape).scalar_subquery(),
    )
    head_job = _job.alias("head_job")
    head_owner = select(head_job.c.owner).where(head_job.c.id == head).scalar_subquery()
    # ... and their oldest such job, which reserves the devices once it has waited
    # reserve_after_s. Looked for only when something queued is that old (the queue's
    # oldest row, by ix_job_queued_id).
    reserving = _user.alias("reserving")
    their_oldest = _best_of(reserving, "aged", "total", "gpu_total", shape, oldest=True)
    oldest = _job.alias("oldest")
    oldest_at = select(oldest.c.created_at).where(queued(oldest)).order_by(oldest.c.id).limit(1)
    reserved = _job.alias("reserved")
    starving = select(reserved.c.id).where(
        oldest_at.scalar_subquery() < bindparam("starve_before"),
        reserved.c.id
        == select(their_oldest.scalar_subquery())
        .where(reserving.c.name == head_owner)
        .scalar_subquery(),
        reserved.c.created_at < bindparam("starve_before"),
    )

    # A CTE: named twice below, written (and planned) once.
    reserved_job = starving.cte("reserved_job")
    reserved_id = select(reserved_job.c.id).scalar_subquery()
    # A reserved job is taken if it fits the free devices now (its owner's quota was
    # checked when it was found), and nothing else is; without one, fair share's walk.
    # Two branches rather than a reservation term in every probe: PostgreSQL read
    # "id = coalesce(reserved, id)" as a term that keeps one row of the user's queue, and
    # sorted all of it for each probe instead of reading ix_job_owner_claim in order.
    taken = _job.alias("taken")
    reserved_if_fits = (
        select(taken.c.id)
        .where(taken.c.id == reserved_id, *_claimable(taken, "free", "gpu_room", shape))
        .with_for_update(skip_locked=True)
        .scalar_subquery()
    )

    def candidate(user: Any) -> Any:
        best = _best_of(user, "candidate", "free", "gpu_room", shape)
        return best.with_for_update(skip_locked=True).scalar_subquery()

    walk = _first_user("claimant", candidate)
    return take(case((reserved_id.is_(None), walk), else_=reserved_if_fits))


def take(target: Any) -> Any:
    """The UPDATE that makes the job ``target`` (a scalar subquery, or a parameter) running,
    if it is still queued, returning what a ``Claim`` holds: the claim's, and the start of
    a gang that is whole (``gang.py``)."""
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
            preempted_attempt=None,  # a preempted attempt's mark is not the next one's
            reason_code=ReasonCode.running,
            reason_message=bindparam("message"),
            **NEXT_STATUS,
        )
        .returning(*CLAIM_COLUMNS)
    )


# An idle worker's poll mostly finds nothing: it looks (no lock) before it takes one. It
# looks as the claim does, quotas included: a queue whose jobs all wait on their owners'
# quotas must not take the write lock at every poll.
@functools.cache
def _any_fits(shape: Shape) -> Any:
    def best(user: Any) -> Any:
        return _best_of(user, "fits", "free", "gpu_room", shape).scalar_subquery()

    return select(_first_user("fits_user", best))


@functools.cache
def _pending(shape: Shape) -> Any:
    claimable = _claimable(_job, "total", "gpu_total", shape, runnable=False)
    # as the claim walks the users: a job whose owner has no user row is never taken
    owned = select(_user.c.name).where(_user.c.name == _job.c.owner).exists()
    return select(func.count()).select_from(_job).where(*claimable, owned)


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
    max_running_devices: int | None = None,
    peek: bool = False,
    max_nodes: int = 1,
) -> Claim | None:
    """Atomically take the best queued job that fits, or None. Exactly one worker wins.

    A job fits in ``free_devices`` whole devices, or, asking for a share of one GPU, in
    ``gpu_room_gb`` (the most GiB a share could have on one of this worker's GPUs now;
    ``gpu_total_gb``: on its largest GPU, idle).

    Best is highest priority, then oldest; a smaller job may overtake one that does not
    fit yet, unless that one has waited ``reserve_after_s``: then nothing else is claimed
    here until enough devices are free for it, so a large job cannot starve.

    Fair share comes first: the user with the least recent usage who has a job that fits
    is served before the others, and a job whose owner's jobs already hold their running
    quota (``trainyard_user.max_running_devices``, else ``max_running_devices``; None: no
    limit) waits. The order is the users' at the last charge (the supervisors' heartbeats):
    claims in between all see the same.
    """
    if free_devices < 1 and gpu_room_gb <= 0:
        return None
    now = utcnow()
    params = {
        "free": free_devices,
        "total": total_devices or free_devices,
        "gpu_room": gpu_room_gb,
        "gpu_total": gpu_total_gb or gpu_room_gb,
        "now": now,
        "max_running": max_running_devices,
        "max_nodes": max_nodes,
    }
    shape, offer = _shape_params(served_accelerators(accelerator), recipes, across=max_nodes > 1)
    params.update(offer)
    if peek:
        with engine.connect() as conn:
            if conn.execute(_any_fits(shape), params).scalar() is None:
                return None
    starve_before = _NEVER if reserve_after_s is None else now - timedelta(seconds=reserve_after_s)
    with statement_connection(engine) as conn:  # Core: an ORM session costs ~0.3 ms here
        row = conn.execute(
            _take_one(shape),
            {
                **params,
                "starve_before": starve_before,
                "worker": worker_id,
                "token": secrets.token_hex(16),
                "expires": now + timedelta(seconds=lease_s),
                "message": f"attempt running on {worker_id}",
            },
        ).one_or_none()  # exactly one row, or none: WHERE id = one id AND still queued
    return None if row is None else claim_of(row)


def pending_count(
    engine: Engine,
    *,
    max_devices: int,
    accelerator: str,
    recipes: list[str],
    gpu_total_gb: float = 0.0,
    max_nodes: int = 1,
) -> int:
    """Queued jobs this worker could ever run, including ones waiting out a retry back-off
    or their owner's running quota."""
    params = {
        "total": max_devices,
        "gpu_total": gpu_total_gb,
        "max_nodes": max_nodes,
    }
    shape, offer = _shape_params(served_accelerators(accelerator), recipes, across=max_nodes > 1)
    with read_session(engine) as session:
        return int(session.execute(_pending(shape), {**params, **offer}).scalar_one())


def record_start(engine: Engine, fence: Fence, *, devices: list[int], pgid: int) -> bool:
    """Note which devices and process group an attempt holds (for kill and crash recovery)."""
    with write_session(engine) as session:
        result = session.exec(
            update(Job).where(*fenced(fence)).values(assigned_devices=devices, runner_pgid=pgid)
        )
        return bool(result.rowcount == 1)


# A reason as the store writes it: its code and its sentence.
Reason = tuple[ReasonCode, str]


def record_executor(
    engine: Engine, fence: Fence, *, executor_id: str | None = None, reason: Reason | None = None
) -> bool:
    """Note what an executor said of a running attempt: its own id for it (Slurm's job id,
    for adopting it after a restart), or why it waits there and where it runs
    (``reason``: code and message)."""
    values: dict[str, Any] = {}
    if executor_id is not None:
        values["executor_id"] = executor_id
    if reason is not None:
        values.update(reason_code=reason[0], reason_message=reason[1][:2000])
    with write_session(engine) as session:
        result = session.exec(update(Job).where(*fenced(fence)).values(**values))
        return bool(result.rowcount == 1)


class Held(NamedTuple):
    """A lease still held, with what the worker needs to act on: cancel, stalled steps,
    and a preemption of this attempt (by another node's worker, for a job across boxes)."""

    status: JobStatus
    step: int | None
    preempted: bool = False


# Fences per statement when renewing at once (well under SQLite's bound on parameters).
_RENEW_CHUNK = 300


def renew_leases_at_once(engine: Engine, fences: list[Fence], lease_s: float) -> dict[int, Held]:
    """``renew_lease`` in one statement per few hundred fences, for a worker whose jobs no
    other worker renews (a Slurm worker's hundreds of attempts): each fence's job, attempt
    and token matched as one tuple, so no row another attempt holds is extended. (A box's
    nodes of a job across boxes renew the same rows as their gang's other workers: they
    go row by row, in job order, so no two lock them in opposite orders.)"""
    expires = utcnow() + timedelta(seconds=lease_s)
    held: dict[int, Held] = {}
    with write_session(engine) as session:
        for start in range(0, len(fences), _RENEW_CHUNK):
            chunk = fences[start : start + _RENEW_CHUNK]
            rows = session.execute(
                update(_job)
                .where(
                    tuple_(_job.c.id, _job.c.attempt, _job.c.lease_token).in_(
                        [(f.job_id, f.attempt, f.lease_token) for f in chunk]
                    ),
                    _job.c.status.in_([s.value for s in ACTIVE]),
                    _job.c.lease_expires_at > utcnow(),
                )
                .values(lease_expires_at=expires)
                .returning(
                    _job.c.id,
                    _job.c.attempt,
                    _job.c.status,
                    _job.c.progress,
                    _job.c.preempted_attempt,
                )  # fmt: skip
            )
            for job_id, attempt, status, progress, preempted in rows:
                step = (progress or {}).get("step")
                held[job_id] = Held(JobStatus(status), step, preempted == attempt)
    return held


def renew_lease(engine: Engine, fences: list[Fence], lease_s: float) -> dict[int, Held]:
    """Extend the leases still held; returns job id -> Held for those (lost ones are absent)."""
    if not fences:
        return {}
    expires = utcnow() + timedelta(seconds=lease_s)
    held: dict[int, Held] = {}
    with write_session(engine) as session:
        # in job order: the nodes of jobs across boxes renew the same rows, and two
        # workers locking two of them in opposite orders would deadlock
        for fence in sorted(fences, key=lambda f: f.job_id):
            row = session.exec(
                update(Job)
                .where(*fenced(fence))
                .values(lease_expires_at=expires)
                .returning(Job.status, Job.progress, Job.preempted_attempt)
            ).first()
            if row is not None:
                status, progress, preempted = row
                step = (progress or {}).get("step")
                held[fence.job_id] = Held(JobStatus(status), step, preempted == fence.attempt)
    return held
