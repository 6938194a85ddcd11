"""/metrics' aggregates computed in the database (a scrape once read every finished job
into Python): the same figures as counting the rows in Python, on SQLite's and
PostgreSQL's date arithmetic."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import Engine, update
from sqlmodel import Session

from service.models import Job
from service.store import stats

SPEC = {"recipe": "mlp-regression", "devices": 1, "accelerator": "cpu"}
# (status, seconds its last attempt ran); None: never started
JOBS = [
    ("succeeded", 30.5),
    ("succeeded", 60.0),  # on a bound: counted in it (le)
    ("failed", 61.25),
    ("cancelled", 7200.0),
    ("succeeded", 9 * 24 * 3600.0),  # past the last bound: +Inf only
    ("queued", None),
    ("cancelled", None),  # cancelled while queued: no duration
]


def test_aggregates_match_the_rows(client: TestClient, add_worker: Any, engine: Engine) -> None:
    add_worker("box")
    ids = [client.post("/api/v1/jobs", json=SPEC).json()["id"] for _ in JOBS]
    # A start where SQLite's julianday() difference for 60 s came out as 60.00000004
    # (about one start in eleven did): the bound must still count it.
    start = datetime(2026, 11, 5, 14, 7, 22, 592215)
    with Session(engine) as session:
        for job_id, (status, seconds) in zip(ids, JOBS, strict=True):
            values: dict[str, Any] = {"status": status}
            if seconds is not None:
                values |= {"started_at": start, "finished_at": start + timedelta(seconds=seconds)}
            session.execute(update(Job).where(Job.id == job_id).values(**values))  # type: ignore[arg-type]
        session.commit()
        by_status = stats.jobs_by_status(session)
        histogram = stats.duration_histogram(session, (60.0, 3600.0, 7 * 24 * 3600.0))
    assert by_status == {"succeeded": 3, "failed": 1, "cancelled": 2, "queued": 1}
    assert histogram.cumulative == [2, 3, 4]
    assert histogram.count == 5
    want = sum(s for _, s in JOBS if s is not None)
    assert abs(histogram.sum_s - want) < 1e-3 * len(JOBS), (histogram.sum_s, want)
