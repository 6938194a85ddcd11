"""Every SQL statement about sweeps: the new sweep, the driver's lease, a trial started
with its job in one transaction, trials ended and pruned, the sweep cancelled or ended,
and the reads the API shows.

A driver's writes carry its fence ``(sweep id, lease token)`` and change nothing once
its lease is gone, as a worker's writes to a job do: two API processes can never both
start a sweep's trial ``n`` (and the unique (sweep, number) would refuse the second).
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import Engine, or_, select, update
from sqlmodel import Session, col

from service import audit
from service.audit import Action
from service.db import read_session, write_session
from service.errors import InvalidTransition, QueueQuotaReached, SweepNotFound
from service.models import Job, JobCreate, JobStatus, utcnow
from service.reasons import ReasonCode
from service.store.submit import NewJob, QueueLimit, insert_jobs, job_row
from service.store.transitions import cancel_in
from service.sweeps.models import Sweep, SweepCreate, SweepStatus, SweepTrial, TrialState
from service.users import Identity, check_may_act
from service.webhooks import outbox

UNFINISHED = (JobStatus.queued, JobStatus.running, JobStatus.cancelling)


@dataclass(frozen=True)
class SweepFence:
    """Proof that a driver still holds a sweep; every driver write carries one."""

    sweep_id: int
    lease_token: str


def create_sweep(engine: Engine, spec: SweepCreate, owner: str) -> Sweep:
    """Store a checked sweep, running; a driver picks it up on its next pass."""
    with write_session(engine) as session:
        sweep = Sweep(**{"owner": owner, "name": spec.name, "spec": spec.model_dump(mode="json")})
        session.add(sweep)
        session.flush()
        audit.record(session, owner, Action.sweep_submitted, f"sweep {sweep.id}")
        return sweep


def take_sweeps(engine: Engine, driver_id: str, lease_s: float, limit: int) -> list[SweepFence]:
    """Running sweeps no driver holds (never held, or its lease ran out), taken by this one."""
    now = utcnow()
    free = or_(col(Sweep.lease_expires_at).is_(None), col(Sweep.lease_expires_at) < now)
    with read_session(engine) as session:  # most passes find none: no write lock for that
        if (
            session.exec(select(Sweep.id).where(Sweep.status == SweepStatus.running, free)).first()
            is None
        ):
            return []
    with write_session(engine) as session:
        ids = session.exec(
            select(Sweep.id)
            .where(Sweep.status == SweepStatus.running, free)
            .order_by(col(Sweep.id))
            .limit(limit)
            .with_for_update(skip_locked=True)
        ).all()
        taken = []
        for (sweep_id,) in ids:
            token = secrets.token_hex(16)
            done = session.exec(
                update(Sweep)
                .where(col(Sweep.id) == sweep_id, Sweep.status == SweepStatus.running, free)
                .values(
                    driver_id=driver_id,
                    lease_token=token,
                    lease_expires_at=now + timedelta(seconds=lease_s),
                )
            )
            if done.rowcount == 1:
                taken.append(SweepFence(sweep_id, token))
        return taken


def renew(engine: Engine, fence: SweepFence, lease_s: float) -> bool:
    """Keep holding the sweep; False once it is not ours (or no longer running)."""
    with write_session(engine) as session:
        done = session.exec(
            update(Sweep)
            .where(*_held(fence))
            .values(lease_expires_at=utcnow() + timedelta(seconds=lease_s))
        )
        return done.rowcount == 1


def let_go(engine: Engine, fences: Sequence[SweepFence]) -> None:
    """Hand sweeps back (a server stopping): the next driver takes them at once."""
    if not fences:
        return
    with write_session(engine) as session:
        for fence in fences:
            session.exec(
                update(Sweep)
                .where(col(Sweep.id) == fence.sweep_id, Sweep.lease_token == fence.lease_token)
                .values(driver_id=None, lease_token=None, lease_expires_at=None)
            )


def start_trial(
    engine: Engine,
    fence: SweepFence,
    *,
    number: int,
    values: dict[str, Any],
    system_attrs: dict[str, Any],
    spec: JobCreate,
    owner: str,
    reason: tuple[ReasonCode, str],
    queue_limit: QueueLimit | None,
) -> int | None:
    """Trial ``number``'s job and row, in one transaction; its job id. None if the lease
    is gone; QueueQuotaReached if its owner's queue is full (nothing written)."""
    with write_session(engine) as session:
        if not _hold(session, fence):
            return None
        row = job_row(spec, reason, owner)
        row["sweep_id"] = fence.sweep_id
        [inserted] = insert_jobs(session, [NewJob(row, queue_limit)])
        if isinstance(inserted, QueueQuotaReached):
            session.rollback()
            raise inserted
        assert not isinstance(inserted, Exception)
        trial = {"number": number, "job_id": inserted.id, "values": values}
        session.add(SweepTrial(sweep_id=fence.sweep_id, system_attrs=system_attrs, **trial))
        return int(inserted.id)


def refused_trial(
    engine: Engine,
    fence: SweepFence,
    number: int,
    values: dict[str, Any],
    system_attrs: dict[str, Any],
    why: str,
) -> bool:
    """Record trial ``number`` failed without a job: its values made a spec no worker
    could run. False if the lease is gone."""
    with write_session(engine) as session:
        if not _hold(session, fence):
            return False
        trial = {"number": number, "values": values, "state": TrialState.failed}
        session.add(
            SweepTrial(
                sweep_id=fence.sweep_id,
                system_attrs=system_attrs,
                message=why,
                ended_at=utcnow(),
                **trial,
            )
        )
        return True


def end_trial(
    engine: Engine, fence: SweepFence, number: int, state: TrialState, value: float | None
) -> bool:
    """Record how a trial ended (as the study was told); False if the lease is gone."""
    with write_session(engine) as session:
        if not _hold(session, fence):
            return False
        session.exec(
            update(SweepTrial)
            .where(*_trial(fence, number))
            .values(state=state, value=value, ended_at=utcnow())
        )
        return True


def note_trial(engine: Engine, fence: SweepFence, number: int, notes: dict[str, Any]) -> bool:
    """Keep what the pruner noted on a trial (the rungs it passed); False if the lease is
    gone."""
    with write_session(engine) as session:
        if not _hold(session, fence):
            return False
        session.exec(update(SweepTrial).where(*_trial(fence, number)).values(system_attrs=notes))
        return True


def prune(
    engine: Engine, fence: SweepFence, number: int, job_id: int, owner: str, why: str
) -> bool:
    """Stop a trial the pruner gave up on, as a cancel stops a job (its reason: pruned),
    and record it pruned. False if the lease is gone."""
    with write_session(engine) as session:
        if not _hold(session, fence):
            return False
        with contextlib.suppress(InvalidTransition):  # it ended meanwhile: as it ended
            cancel_in(session, job_id, Identity(owner, admin=False), pruned=why)
        session.exec(
            update(SweepTrial)
            .where(*_trial(fence, number))
            .values(state=TrialState.pruned, ended_at=utcnow())
        )
        return True


def end_sweep(
    engine: Engine, fence: SweepFence, status: SweepStatus, reason: tuple[str, str]
) -> bool:
    """The driver ends the sweep (finished, or failed: its unfinished trials cancelled,
    as its owner would); False if the lease is gone."""
    with write_session(engine) as session:
        sweep = session.exec(
            select(Sweep).where(*_held(fence)).with_for_update()
        ).scalar_one_or_none()
        if sweep is None:
            return False
        _cancel_open(session, fence.sweep_id, Identity(sweep.owner, admin=False))
        sweep.status = status
        sweep.reason_code, sweep.reason_message = reason
        sweep.finished_at = utcnow()
        sweep.driver_id = sweep.lease_token = sweep.lease_expires_at = None
        session.add(sweep)
        outbox.sweep_ended(session, sweep)
        return True


def cancel_sweep(engine: Engine, sweep_id: int, by: Identity) -> Sweep:
    """End a running sweep and cancel every unfinished trial, in one transaction: no
    driver can start another once it commits. Idempotent; a finished sweep is refused."""
    with write_session(engine) as session:
        sweep = session.get(Sweep, sweep_id, with_for_update=True)
        if sweep is None:
            raise SweepNotFound(sweep_id)
        check_may_act(by, sweep.owner, f"sweep {sweep_id}")
        if sweep.status == SweepStatus.cancelled:
            return sweep
        if sweep.status != SweepStatus.running:
            raise InvalidTransition(f"sweep {sweep_id} already {sweep.status}; nothing to cancel")
        _cancel_open(session, sweep_id, by)
        sweep.status = SweepStatus.cancelled
        sweep.reason_code = ReasonCode.cancelled
        sweep.reason_message = f"cancelled by {by.name}"
        sweep.finished_at = utcnow()
        sweep.driver_id = sweep.lease_token = sweep.lease_expires_at = None
        session.add(sweep)
        audit.record(session, by.name, Action.sweep_cancelled, f"sweep {sweep_id}")
        outbox.sweep_ended(session, sweep)
        session.flush()
        return sweep


def _trial(fence: SweepFence, number: int) -> list[Any]:
    return [col(SweepTrial.sweep_id) == fence.sweep_id, col(SweepTrial.number) == number]


def _cancel_open(session: Session, sweep_id: int, by: Identity) -> None:
    """Cancel the sweep's unfinished trials (one that ends meanwhile is left as it ended)."""
    open_jobs = session.exec(
        select(Job.id).where(Job.sweep_id == sweep_id, col(Job.status).in_(UNFINISHED))
    ).all()
    for (job_id,) in open_jobs:
        with contextlib.suppress(InvalidTransition):
            cancel_in(session, job_id, by)


def _held(fence: SweepFence) -> list[Any]:
    """The sweep is still this driver's: its token, and running. (Not its expiry: taking
    a sweep always sets a new token, so a driver whose lease ran out, but which no other
    took, may still write, and renew.)"""
    return [
        col(Sweep.id) == fence.sweep_id,
        Sweep.lease_token == fence.lease_token,
        Sweep.status == SweepStatus.running,
    ]


def _hold(session: Session, fence: SweepFence) -> bool:
    """Lock the sweep's row if this driver still holds it (the sweep's cancel takes the
    same lock, so a trial is never started after it)."""
    held = session.exec(select(Sweep.id).where(*_held(fence)).with_for_update()).first()
    return held is not None
