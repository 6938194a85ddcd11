"""What a /metrics scrape costs as the job history grows.

    python -m benchmarks.scrape [--jobs 10000 100000] [--databases sqlite postgresql]

Fills a database with finished jobs (one submitted, then copied by INSERT ... SELECT),
then times, side by side in one process, the queue collector as it is (aggregates in
SQL: ``service.store.stats``) and as it was (every finished job's two timestamps read
into Python, bucketed there): median of 7 scrapes each, and the ratio.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, func, insert, select, update
from sqlmodel import Session, col

from benchmarks.common import database, print_table, save
from service import store
from service.api.prometheus import DURATION_BUCKETS_S, QueueCollector
from service.db import make_engine
from service.migrate import upgrade
from service.models import Job, JobCreate, JobStatus, utcnow
from service.settings import Settings
from service.store.tables import job_table

ROUNDS = 7


def fill(engine: Engine, jobs: int) -> None:
    """``jobs`` finished jobs of various durations, by doubling one row."""
    spec = JobCreate.model_validate({"recipe": "mlp-regression", "accelerator": "cpu"})
    store.create_job(engine, spec)
    start = utcnow() - timedelta(days=1)
    with Session(engine) as session:
        session.execute(
            update(Job).values(
                status=JobStatus.succeeded, started_at=start, finished_at=start + timedelta(60)
            )
        )
        copied = [c for c in job_table.c if c.name != "id"]
        count = 1
        while count < jobs:
            rows = select(*copied).limit(jobs - count)
            session.execute(insert(job_table).from_select(copied, rows))
            count = session.execute(select(func.count()).select_from(job_table)).scalar_one()
        session.commit()


def as_it_was(engine: Engine) -> None:
    """The scrape's reading before the aggregates moved into SQL (for comparison only)."""
    with Session(engine) as session:
        by_status = select(col(Job.status), func.count()).group_by(col(Job.status))
        dict(session.execute(by_status).all())
        finished = session.execute(
            select(col(Job.started_at), col(Job.finished_at)).where(
                col(Job.finished_at).is_not(None), col(Job.started_at).is_not(None)
            )
        ).all()
    durations = sorted((end - start).total_seconds() for start, end in finished)
    [sum(1 for d in durations if d <= b) for b in DURATION_BUCKETS_S]


def median_s(scrape: Callable[[], Any]) -> float:
    times = []
    for _ in range(ROUNDS):
        start = time.perf_counter()
        scrape()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--databases", nargs="+", default=["sqlite", "postgresql"])
    args = parser.parse_args()
    rows = []
    for kind in args.databases:
        for jobs in args.jobs:
            with tempfile.TemporaryDirectory() as tmp, database(kind) as url:
                url = url or f"sqlite:///{Path(tmp) / 'trainyard.db'}"
                upgrade(url)
                engine = make_engine(Settings(database_url=url, data_dir=Path(tmp)))
                fill(engine, jobs)
                collector = QueueCollector(engine)
                now_s = median_s(lambda c=collector: list(c.collect()))  # type: ignore[misc]
                was_s = median_s(lambda e=engine: as_it_was(e))  # type: ignore[misc]
                engine.dispose()
            rows.append(
                {
                    "database": kind,
                    "finished jobs": jobs,
                    "scrape now ms": now_s * 1000,
                    "as it was ms": was_s * 1000,
                    "was / now": was_s / now_s,
                }
            )
    print_table("a /metrics scrape's database reading, median of 7", rows)
    print(f"\nsaved to {save('scrape', rows)}")


if __name__ == "__main__":
    main()
