"""Every read of sweeps: a sweep's trials with their jobs' standing, their points of the
sweep's metric, and what the API shows (counts, the best trial, listings). The writes
are ``service.store.sweeps``'s."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, func, select
from sqlmodel import Session, col

from service.errors import SweepNotFound
from service.models import Job, JobStatus, Metric
from service.reasons import ReasonCode
from service.sweeps.models import Sweep, SweepStatus, SweepTrial, TrialState


@dataclass(frozen=True)
class TrialRow:
    """A trial with its job's standing, as the driver and the API read it (a trial with
    no job: status None, its message the reason)."""

    number: int
    job_id: int | None
    values: dict[str, Any]
    system_attrs: dict[str, Any]
    state: TrialState
    value: float | None
    message: str | None
    job_status: JobStatus | None
    reason_code: str | None
    reason_message: str | None
    progress: dict[str, Any] | None


def trials(session: Session, sweep_id: int, numbers: Sequence[int] | None = None) -> list[TrialRow]:
    """A sweep's trials by number (only ``numbers``, if given), each with its job's status."""
    # (mypy gives up on the overloads of a select of eleven columns: misc, ignored)
    query = (
        select(  # type: ignore[misc]
            SweepTrial.number,
            SweepTrial.job_id,
            SweepTrial.values,
            SweepTrial.system_attrs,
            SweepTrial.state,
            SweepTrial.value,
            SweepTrial.message,
            Job.status,
            Job.reason_code,
            Job.reason_message,
            Job.progress,
        )
        .outerjoin(Job, col(Job.id) == SweepTrial.job_id)
        .where(col(SweepTrial.sweep_id) == sweep_id)
        .order_by(col(SweepTrial.number))
    )
    if numbers is not None:
        query = query.where(col(SweepTrial.number).in_(list(numbers)))
    return [TrialRow(*row) for row in session.exec(query).all()]


def points(
    session: Session, job_ids: Sequence[int], metric: str, after_seq: int = 0
) -> list[tuple[int, int, int, float | None, int]]:
    """The jobs' points of one metric (job id, step, epoch, value, seq), after a seq."""
    if not job_ids:
        return []
    rows = session.exec(
        select(Metric.job_id, Metric.step, Metric.epoch, Metric.value, Metric.seq)
        .where(
            and_(
                col(Metric.job_id).in_(list(job_ids)),
                Metric.name == metric,
                col(Metric.seq) > after_seq,
            )
        )
        .order_by(col(Metric.job_id), col(Metric.step))
    ).all()
    return [(r[0], r[1], r[2], r[3], r[4]) for r in rows]


def metric_summary(
    session: Session, job_ids: Sequence[int], metric: str
) -> dict[int, tuple[float | None, float | None, float | None, int]]:
    """Per job, its points of one metric: (last value, min, max, step of the last)."""
    if not job_ids:
        return {}
    ends = (
        select(
            Metric.job_id,
            func.max(Metric.step).label("step"),
            func.min(Metric.value).label("low"),
            func.max(Metric.value).label("high"),
        )
        .where(col(Metric.job_id).in_(list(job_ids)), Metric.name == metric)
        .group_by(col(Metric.job_id))
        .subquery()
    )
    rows = session.exec(
        select(ends.c.job_id, Metric.value, ends.c.low, ends.c.high, ends.c.step).join(
            Metric,
            and_(
                col(Metric.job_id) == ends.c.job_id,
                col(Metric.step) == ends.c.step,
                Metric.name == metric,
            ),
        )
    ).all()
    return {job_id: (last, low, high, step) for job_id, last, low, high, step in rows}


def job_counts(session: Session, sweep_id: int) -> dict[tuple[JobStatus, bool], int]:
    """How many of the sweep's jobs are in each status ((status, pruned) -> count)."""
    pruned = Job.reason_code == ReasonCode.pruned
    rows = session.exec(
        select(Job.status, pruned, func.count())
        .where(Job.sweep_id == sweep_id)
        .group_by(col(Job.status), pruned)
    ).all()
    return {(status, bool(was_pruned)): int(n) for status, was_pruned, n in rows}


def refused_count(session: Session, sweep_id: int) -> int:
    """Trials that never had a job (their spec was refused)."""
    return int(
        session.exec(
            select(func.count())
            .select_from(SweepTrial)
            .where(col(SweepTrial.sweep_id) == sweep_id, col(SweepTrial.job_id).is_(None))
        ).one()[0]
    )


def best_trial(session: Session, sweep_id: int, lowest: bool) -> tuple[int, float] | None:
    """The complete trial with the best value (lowest or highest; ties: the earliest),
    as (number, value), if any."""
    order = col(SweepTrial.value).asc() if lowest else col(SweepTrial.value).desc()
    row = session.exec(
        select(SweepTrial.number, SweepTrial.value)
        .where(
            col(SweepTrial.sweep_id) == sweep_id,
            SweepTrial.state == TrialState.complete,
            col(SweepTrial.value).is_not(None),
        )
        .order_by(order, col(SweepTrial.number))
        .limit(1)
    ).first()
    return None if row is None else (int(row[0]), float(row[1]))


def state_counts(session: Session, sweep_id: int) -> dict[TrialState, int]:
    """How many of the sweep's trials are in each state."""
    rows = session.exec(
        select(SweepTrial.state, func.count())
        .where(col(SweepTrial.sweep_id) == sweep_id)
        .group_by(col(SweepTrial.state))
    ).all()
    return {TrialState(state): int(n) for state, n in rows}


def get_sweep(session: Session, sweep_id: int) -> Sweep:
    sweep = session.get(Sweep, sweep_id)
    if sweep is None:
        raise SweepNotFound(sweep_id)
    return sweep


def list_sweeps(
    session: Session, *, status: SweepStatus | None, owner: str | None, limit: int, offset: int
) -> tuple[list[Sweep], int]:
    """Newest first, with the total matching count."""
    query = select(Sweep)
    count = select(func.count()).select_from(Sweep)
    if status is not None:
        query, count = query.where(Sweep.status == status), count.where(Sweep.status == status)
    if owner is not None:
        query, count = query.where(Sweep.owner == owner), count.where(Sweep.owner == owner)
    rows = session.exec(query.order_by(col(Sweep.id).desc()).limit(limit).offset(offset))
    return list(rows.scalars()), int(session.exec(count).one()[0])
