"""Listing with 100,000 jobs in the database: GET /jobs?limit=50 and ?status=queued.

python -m benchmarks.listing [--jobs 100000] [--requests 200]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from sqlalchemy import insert

from benchmarks.common import print_table, save
from service.db import make_engine, write_session
from service.models import Job, JobCreate, JobStatus
from tests.stack import running_stack


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--requests", type=int, default=200)
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp, running_stack(Path(tmp)) as stack:
        engine = make_engine(stack.env["TRAINYARD_DATABASE_URL"])
        base = Job.model_validate(JobCreate(recipe="mlp-regression").model_dump()).model_dump(
            exclude={"id"}
        )
        statuses = [JobStatus.succeeded, JobStatus.failed, JobStatus.queued, JobStatus.cancelled]
        batch = [{**base, "status": statuses[i % 4]} for i in range(10_000)]
        with write_session(engine) as session:
            for _ in range(args.jobs // len(batch)):
                session.execute(insert(Job), batch)
        for query in ({"limit": 50}, {"limit": 50, "status": "queued"}):
            stack.http.get("/jobs", params=query)  # warm
            times = []
            for _ in range(args.requests):
                start = time.perf_counter()
                r = stack.http.get("/jobs", params=query)
                times.append((time.perf_counter() - start) * 1000)
                assert r.status_code == 200 and len(r.json()["items"]) == 50
            rows.append({
                "query": "&".join(f"{k}={v}" for k, v in query.items()),
                "jobs": args.jobs,
                "p50_ms": statistics.median(times),
                "p99_ms": sorted(times)[int(0.99 * len(times)) - 1],
            })  # fmt: skip
    print_table("listing (HTTP round trip, one client)", rows)
    save("listing", rows)


if __name__ == "__main__":
    main()
