"""What the API shows of a sweep: its trials with their jobs' standing and the metric's
last and best values, its counts, and its best trial."""

from __future__ import annotations

from sqlmodel import Session

from service.models import JobStatus, Progress, Reason
from service.reasons import ReasonCode
from service.store import sweep_reads as store
from service.store.sweep_reads import TrialRow
from service.sweeps.models import Sweep, SweepCounts, SweepRead, TrialRead


def read_sweep(session: Session, sweep: Sweep, *, with_trials: bool = True) -> SweepRead:
    """A sweep as the API shows it; without its trials for a listing."""
    assert sweep.id is not None
    lowest = sweep.spec.get("mode", "min") == "min"
    metric = sweep.spec["metric"]
    best = store.best_trial(session, sweep.id, lowest)
    best_number = best[0] if best is not None else None
    if with_trials:
        rows = store.trials(session, sweep.id)
    else:
        rows = store.trials(session, sweep.id, [best_number]) if best_number is not None else []
    summary = store.metric_summary(session, [r.job_id for r in rows if r.job_id], metric)
    trials = [_trial(row, summary, lowest) for row in rows]
    reason = None
    if sweep.reason_code:
        reason = Reason(code=sweep.reason_code, message=sweep.reason_message or "")
    return SweepRead(
        id=sweep.id,
        name=sweep.name,
        owner=sweep.owner,
        status=sweep.status,
        reason=reason,
        spec=sweep.spec,
        counts=_counts(session, sweep.id),
        best=next((t for t in trials if t.number == best_number), None),
        trials=trials if with_trials else [],
        created_at=sweep.created_at,
        finished_at=sweep.finished_at,
    )


def _trial(
    row: TrialRow,
    summary: dict[int, tuple[float | None, float | None, float | None, int]],
    lowest: bool,
) -> TrialRead:
    last = low = high = step = None
    if row.job_id is not None and row.job_id in summary:
        last, low, high, step = summary[row.job_id]
    if row.job_status is None:  # never started: its spec was refused
        status = JobStatus.failed
        reason = Reason(code=ReasonCode.bad_spec, message=row.message or "")
    else:
        status = row.job_status
        reason = None
        if row.reason_code:
            reason = Reason(code=row.reason_code, message=row.reason_message or "")
    return TrialRead(
        number=row.number,
        job_id=row.job_id,
        values=row.values,
        status=status,
        pruned=row.reason_code == ReasonCode.pruned,
        reason=reason,
        last=last,
        best=low if lowest else high,
        step=step,
        progress=Progress.model_validate(row.progress) if row.progress else None,
    )


def _counts(session: Session, sweep_id: int) -> SweepCounts:
    counts = SweepCounts(failed=store.refused_count(session, sweep_id))
    for (status, pruned), n in store.job_counts(session, sweep_id).items():
        if pruned and status == JobStatus.cancelled:
            counts.pruned += n
        elif status in (JobStatus.running, JobStatus.cancelling):
            counts.running += n
        else:
            setattr(counts, status.value, getattr(counts, status.value) + n)
    counts.total = (
        counts.queued
        + counts.running
        + counts.succeeded
        + counts.failed
        + counts.cancelled
        + counts.pruned
    )
    return counts
