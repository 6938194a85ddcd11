"""What a running attempt reports: progress and metric points, log lines (with the bound
on how many a job keeps) and its reproducibility record. Every write is fenced."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Engine, insert, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlmodel import Session

from service.db import write_session
from service.models import Job, Metric
from service.points import MetricPoint, ProgressPoint, storable_text
from service.store.tables import job_table as _job
from service.store.tables import log_table as _log
from service.store.transitions import Fence, fenced

_INSERT_LOG = insert(_log)
# INSERT that skips points whose (job, name, step) exists: a resumed run re-reports some.
_INSERT_METRIC = {
    "sqlite": sqlite.insert(Metric.__table__).on_conflict_do_nothing(),  # type: ignore[attr-defined]
    "postgresql": postgresql.insert(Metric.__table__).on_conflict_do_nothing(),  # type: ignore[attr-defined]
}


def report(
    engine: Engine,
    fence: Fence,
    *,
    progress: ProgressPoint | None = None,
    metrics: Sequence[MetricPoint] = (),
) -> bool:
    """Write progress and metric points of a running attempt in one transaction (fenced)."""
    taken = len(metrics) + (progress is not None)
    if not taken:
        return True
    values: dict[str, Any] = {"event_seq": _job.c.event_seq + taken}
    if progress is not None:  # progress takes the last number, after the points it sums up
        values |= {"progress": progress.as_dict(), "progress_seq": _job.c.event_seq + taken}
    with write_session(engine) as session:
        last = session.execute(
            update(_job).where(*fenced(fence)).values(**values).returning(_job.c.event_seq)
        ).scalar_one_or_none()
        if last is None:
            return False
        if metrics:
            # executemany of one prebuilt statement: the driver loops in C. A multi-row
            # VALUES statement would be compiled anew for every batch size.
            first = last - taken + 1
            rows = [
                {"job_id": fence.job_id, "seq": first + i, **m.as_dict()}
                for i, m in enumerate(metrics)
            ]
            session.execute(_INSERT_METRIC[engine.dialect.name], rows)
        return True


def record_environment(engine: Engine, fence: Fence, environment: dict[str, Any]) -> bool:
    """Store an attempt's reproducibility record on the job (fenced)."""
    with write_session(engine) as session:
        result = session.execute(update(Job).where(*fenced(fence)).values(environment=environment))
        return bool(result.rowcount == 1)  # type: ignore[attr-defined]


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
            .where(*fenced(fence))
            .values(event_seq=_job.c.event_seq + n, log_count=_job.c.log_count + n)
            .returning(_job.c.event_seq, _job.c.log_count, _job.c.log_marker_seq)
        ).one_or_none()
        if row is None:
            return False
        first = row.event_seq - n + 1
        session.execute(
            _INSERT_LOG,
            [
                {
                    "job_id": fence.job_id,
                    "seq": first + i,
                    "time": t,
                    "stream": s,
                    "text": storable_text(x),  # a NUL would fail the batch
                }
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
