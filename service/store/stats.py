"""Aggregates over every job, computed by the database: what a /metrics scrape reads.

A scrape must not bring the job history into Python: one row per status, and one row
for the duration histogram (a sum per bucket), whatever the number of jobs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Float, case, func, select
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import FunctionElement
from sqlmodel import Session, col

from service.models import Job


class seconds_between(FunctionElement[float]):  # noqa: N801  (an SQL function's name)
    """``end - start`` in seconds, in each database's own date arithmetic."""

    type = Float()
    inherit_cache = True
    name = "seconds_between"


@compiles(seconds_between)
def _seconds_between_postgresql(element: Any, compiler: SQLCompiler, **kw: Any) -> str:
    start, end = (compiler.process(c, **kw) for c in element.clauses)
    return f"EXTRACT(EPOCH FROM ({end} - {start}))"


@compiles(seconds_between, "sqlite")
def _seconds_between_sqlite(element: Any, compiler: SQLCompiler, **kw: Any) -> str:
    # julianday() counts whole milliseconds, but as a day fraction near 2.46e6: the
    # difference carries float noise (60 s came out as 60.00000004, past a 60 s bound).
    # Rounding to the millisecond gives back the exact figure.
    start, end = (compiler.process(c, **kw) for c in element.clauses)
    return f"ROUND((julianday({end}) - julianday({start})) * 86400.0, 3)"


def jobs_by_status(session: Session) -> dict[str, int]:
    """How many jobs are in each status (statuses with none are absent)."""
    rows = session.execute(select(Job.status, func.count()).group_by(Job.status)).all()
    return {str(status): n for status, n in rows}


@dataclass(frozen=True)
class DurationHistogram:
    """Finished jobs' last attempts by wall time: cumulative counts per upper bound."""

    cumulative: list[int]
    count: int
    sum_s: float


def duration_histogram(session: Session, bounds_s: tuple[float, ...]) -> DurationHistogram:
    """The histogram of finished jobs' last attempt durations, in one aggregate row."""
    seconds = seconds_between(Job.started_at, Job.finished_at)
    per_bound = [func.coalesce(func.sum(case((seconds <= b, 1), else_=0)), 0) for b in bounds_s]
    row = session.execute(
        select(func.count(), func.coalesce(func.sum(seconds), 0.0), *per_bound).where(
            col(Job.finished_at).is_not(None), col(Job.started_at).is_not(None)
        )
    ).one()
    count, total, *cumulative = row
    return DurationHistogram([int(n) for n in cumulative], int(count), float(total))
