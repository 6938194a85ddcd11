"""Status changes: the state machine and every write that moves a job along it.

Every transition is a conditional UPDATE whose WHERE clause names the statuses it may
come from (``ALLOWED_FROM``) and, for writes by a worker, the fence
``(job id, attempt, lease token)``. A write whose condition no longer holds changes
nothing and reports so. Where the next status depends on the row (finish, cancel, a lost
worker's jobs), the row is read under its lock (FOR UPDATE; SQLite's IMMEDIATE
transaction), so nothing can change between the decision and the write.

The one status write outside this module is the claim (queued -> running), a prebuilt
statement in ``service.store.claim`` so that its SQL stays in one place.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Engine, case, delete, or_, select, update
from sqlmodel import Session, col

from service import audit
from service.audit import Action
from service.db import write_session
from service.errors import InvalidTransition, JobNotFound
from service.models import Job, JobStatus, utcnow
from service.reasons import ReasonCode
from service.store import retries
from service.store.tables import job_table, node_table
from service.users import BOOTSTRAP, Identity, check_may_act
from service.wakeup import announce_job
from service.webhooks import outbox

S = JobStatus
R = ReasonCode
# target status -> the statuses a job may reach it from
ALLOWED_FROM: dict[JobStatus, frozenset[JobStatus]] = {
    S.running: frozenset({S.queued}),  # claim
    S.cancelling: frozenset({S.running}),  # cancel while a worker trains it
    S.queued: frozenset({S.running}),  # retry, or the worker was lost
    S.succeeded: frozenset({S.running, S.cancelling}),  # finished before the cancel landed
    S.failed: frozenset({S.running}),  # a cancelling job ends cancelled, however it ends
    S.cancelled: frozenset({S.queued, S.cancelling}),
}
ACTIVE = (S.running, S.cancelling)

# Back-off before a failed attempt runs again: 1 s, 2 s, 4 s ... capped.
RETRY_BACKOFF_BASE_S = 1.0
RETRY_BACKOFF_MAX_S = 60.0


@dataclass(frozen=True)
class Fence:
    """Proof that a worker still owns an attempt; every worker write carries one."""

    job_id: int
    attempt: int
    lease_token: str


def fenced(fence: Fence) -> list[Any]:
    """The attempt still owns the job: same attempt and token, and the lease has not run
    out (once it has, nothing the attempt does can count, even before anyone requeues)."""
    return [
        Job.id == fence.job_id,
        Job.attempt == fence.attempt,
        Job.lease_token == fence.lease_token,
        col(Job.status).in_(ACTIVE),
        col(Job.lease_expires_at) > utcnow(),
    ]


@dataclass(frozen=True)
class Outcome:
    """How an attempt ended, as the worker saw it."""

    status: JobStatus  # succeeded, failed or cancelled
    reason_code: ReasonCode
    reason_message: str
    error: dict[str, Any] | None = None
    result: dict[str, Any] | None = None
    retryable: bool = False  # another attempt could end otherwise
    own: bool = False  # the job's own code failed: retried only as retries_on_error allows


def _lease_ended(code: ReasonCode, message: str, **more: Any) -> dict[str, Any]:
    """Values that end an attempt's hold on a job, with the reason why."""
    return {
        "reason_code": code,
        "reason_message": message,
        "lease_token": None,
        "lease_expires_at": None,
        "runner_pgid": None,
        "executor_id": None,  # Slurm's job of the attempt that ended
        **more,
    }


# A status change takes the job's next event number (see Job.event_seq).
NEXT_STATUS = {
    "event_seq": job_table.c.event_seq + 1,
    "status_seq": job_table.c.event_seq + 1,
}


def _transition(
    session: Session, job_id: int, to: JobStatus, *where: Any, **values: Any
) -> Job | None:
    """Move one job to ``to`` if it is in an allowed status and ``where`` holds."""
    if to == S.cancelled and values.get("reason_code") == R.cancelled:
        # A trial its sweep's pruner stopped ends pruned, however its stop ends: the
        # reason set when the stop was asked stands (what a listing tells apart).
        was_pruned = job_table.c.reason_code == R.pruned
        values["reason_code"] = case((was_pruned, job_table.c.reason_code), else_=R.cancelled)
        values["reason_message"] = case(
            (was_pruned, job_table.c.reason_message), else_=values["reason_message"]
        )
    stmt = (
        update(Job)
        .where(Job.id == job_id, col(Job.status).in_(ALLOWED_FROM[to]), *where)
        .values(status=to, **NEXT_STATUS, **values)
        .returning(Job)
        .execution_options(synchronize_session=False, populate_existing=True)
    )
    job = session.exec(stmt).scalar_one_or_none()
    if job is not None:
        # in this transaction: a change that rolls back tells no webhook
        outbox.job_changed(session, job, to)
    if job is not None and to == S.queued:
        announce_job(session)  # a retry or a job handed back: claimable again
    if job is not None and job.nodes > 1 and to not in ACTIVE:
        # a job across boxes is off its nodes: the next attempt forms a new gang
        session.exec(delete(node_table).where(node_table.c.job_id == job_id))
    return job


def cancel_job(engine: Engine, job_id: int, by: Identity = BOOTSTRAP) -> Job:
    """Queued -> cancelled now; running -> cancelling (the worker stops it). Idempotent.
    ``by``: who asks; only the job's owner or an admin may (NotAllowed)."""
    with write_session(engine) as session:
        return cancel_in(session, job_id, by)


def cancel_in(session: Session, job_id: int, by: Identity, pruned: str | None = None) -> Job:
    """``cancel_job`` in the caller's transaction. With ``pruned`` (why), a sweep's pruner
    stops the trial: the same stop, ending with reason ``pruned`` instead of
    ``cancelled``."""
    # Locked (PostgreSQL): a worker cannot finish or claim it between read and write.
    # (populate_existing: a row this session read before is read again, under the lock)
    job = session.get(Job, job_id, with_for_update=True, populate_existing=True)
    if job is None:
        raise JobNotFound(job_id)
    check_may_act(by, job.owner, f"job {job_id}")
    if job.status in (S.cancelling, S.cancelled):
        return job
    if job.status in (S.succeeded, S.failed):
        raise InvalidTransition(f"job {job_id} already {job.status}; nothing to cancel")
    if job.status == S.queued:
        code, message = R.cancelled, "cancelled before it started"
        if pruned is not None:
            code, message = R.pruned, pruned
        done = _transition(
            session, job_id, S.cancelled, finished_at=utcnow(), reason_code=code,
            reason_message=message,
        )  # fmt: skip
    else:
        code, message = R.cancelling, "cancel requested; stopping the job"
        if pruned is not None:
            code, message = R.pruned, pruned  # kept as it ends (see _transition)
        done = _transition(session, job_id, S.cancelling, reason_code=code, reason_message=message)
    assert done is not None, "status changed under the row lock / IMMEDIATE transaction"
    action = Action.cancelled if pruned is None else Action.pruned
    audit.record(session, by.name, action, f"job {job_id}", owner=job.owner)
    return done


def finish_attempt(engine: Engine, fence: Fence, outcome: Outcome) -> Job | None:
    """End an attempt: final status, or back to queued when it failed and may be retried."""
    now = utcnow()
    with write_session(engine) as session:
        job = session.exec(select(Job).where(*fenced(fence)).with_for_update()).scalar_one_or_none()
        if job is None:
            return None  # the lease was lost; the job is someone else's now
        message, error = outcome.reason_message, outcome.error
        own = retries.own_failures(job) + outcome.own
        if outcome.status != S.succeeded and error is not None:
            error = retries.counted(error, own)
        elif outcome.status != S.succeeded and own:
            error = job.error  # none of this attempt's: the job's last, which keeps the count
        if job.status == S.cancelling and outcome.status != S.succeeded:
            return _transition(
                session,
                job.id,
                S.cancelled,
                finished_at=now,
                error=error,
                **_lease_ended(R.cancelled, "cancelled while running"),
            )
        if outcome.status == S.failed and job.preempted_attempt == fence.attempt:
            # A node of a job across boxes stopped for another job: its ranks' collective
            # broke as the others stopped, before its worker heard of the mark. Stopped,
            # not failed: no attempt spent.
            message = "preempted with the rest of its nodes; resumes from its last checkpoint"
            return _hand_back(session, fence, R.preempted, message)
        if outcome.status == S.failed and outcome.retryable:
            if outcome.own and own > job.retries_on_error:  # the same code fails again
                message = retries.noted(message, retries.own_note(own, job.retries_on_error))
            elif job.attempt < job.max_attempts:
                note = retries.own_note(own, job.retries_on_error) if outcome.own else None
                common = _lease_ended(outcome.reason_code, message)
                return _requeue(session, job, now, common, error=error, own_note=note)
        target = S.failed if outcome.status == S.cancelled else outcome.status
        return _transition(
            session,
            job.id,
            target,
            *fenced(fence),
            finished_at=now,
            error=error,
            result=outcome.result,
            **_lease_ended(outcome.reason_code, message),
        )


def _requeue(
    session: Session,
    job: Job,
    now: datetime,
    common: dict[str, Any],
    *,
    back_off: bool = True,
    own_note: str | None = None,
    **values: Any,
) -> Job | None:
    """Queue the next attempt; after a back-off when the job itself failed."""
    assert job.id is not None
    delay = min(RETRY_BACKOFF_BASE_S * 2 ** (job.attempt - 1), RETRY_BACKOFF_MAX_S)
    delay = delay if back_off else 0.0
    note = f"attempt {job.attempt} of {job.max_attempts}; retrying"
    message = retries.noted(common["reason_message"], f"{note}; {own_note}" if own_note else note)
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


def release_attempt(
    engine: Engine, fence: Fence, reason_code: ReasonCode, message: str
) -> Job | None:
    """Give a running job back to the queue without spending an attempt (worker shutdown)."""
    with write_session(engine) as session:
        return _hand_back(session, fence, reason_code, message)


def _hand_back(session: Session, fence: Fence, reason_code: ReasonCode, message: str) -> Job | None:
    off_worker = {"worker_id": None, "assigned_devices": None}
    done = _transition(
        session,
        fence.job_id,
        S.queued,
        *fenced(fence),
        run_after=None,
        **_lease_ended(reason_code, message, **off_worker),
    )
    if done is None:  # cancel asked meanwhile: honour it rather than requeue
        done = _transition(
            session,
            fence.job_id,
            S.cancelled,
            *fenced(fence),
            finished_at=utcnow(),
            **_lease_ended(R.cancelled, "cancelled while running", **off_worker),
        )
    return done


def expire_leases(engine: Engine) -> list[int]:
    """Requeue (or end) jobs whose worker stopped renewing its lease; returns their ids."""
    return _abandon(
        engine,
        [col(Job.lease_expires_at) < utcnow()],
        R.worker_lost,
        "worker {worker} stopped renewing its lease",
    )


def abandon_worker_jobs(engine: Engine, worker_id: str) -> list[int]:
    """Requeue the jobs a worker held before it restarted (its processes are already
    killed): its own, and those across boxes it was a node of."""
    its_nodes = select(node_table.c.job_id).where(
        node_table.c.worker_id == worker_id, node_table.c.done_at.is_(None)
    )
    return _abandon(
        engine,
        [or_(Job.worker_id == worker_id, col(Job.id).in_(its_nodes))],
        R.worker_restarted,
        "worker {worker} restarted while running the job",
        worker=worker_id,  # not the job's (node 0's, for a job across boxes)
    )


def _abandon(
    engine: Engine, where: list[Any], code: ReasonCode, message: str, worker: str | None = None
) -> list[int]:
    """Active jobs matching ``where`` lose their attempt: retried if they may be, else ended
    (``message`` names ``worker``, by default the job's)."""
    now = utcnow()
    changed: list[int] = []
    with write_session(engine) as session:
        # SKIP LOCKED (PostgreSQL): a job whose row another session holds is that session's
        # business now; the next pass sees it again.
        query = select(Job).where(col(Job.status).in_(ACTIVE), *where)
        jobs = session.exec(query.with_for_update(skip_locked=True)).scalars().all()
        for job in jobs:
            why = message.format(worker=worker or job.worker_id)
            common = _lease_ended(code, why)
            if job.status == S.cancelling:  # what was asked is done: it no longer runs
                ended = _lease_ended(ReasonCode.cancelled, f"cancelled while running ({why})")
                done = _transition(session, job.id, S.cancelled, finished_at=now, **ended)
            elif job.attempt < job.max_attempts:
                # the worker failed, not the job: no reason to wait before the next attempt
                done = _requeue(session, job, now, common, back_off=False)
            else:
                done = _transition(session, job.id, S.failed, finished_at=now, **common)
            if done is not None:
                changed.append(job.id)
    return changed
