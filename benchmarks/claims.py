"""Claims at the SQL level: processes claiming from 10,000 queued jobs of 50 users (fair
share walks the users), on SQLite (two processes: one box) and on PostgreSQL (four:
several boxes); on PostgreSQL also the same statement sent by bare psycopg, side by side,
for the ceiling of the machine.

python -m benchmarks.claims [--jobs 10000] [--users 50] [--databases sqlite:2,postgresql:4]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import secrets
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg
from sqlalchemy import insert
from sqlalchemy.engine import make_url

from benchmarks.common import database, print_table, save
from service import store
from service.db import make_engine, write_session
from service.migrate import upgrade
from service.models import Job, JobCreate, User
from tests.databases import claim_as_sent

CLAIM = {"free_devices": 1, "total_devices": 1, "accelerator": "cpu", "recipes": ["r"],
         "lease_s": 60.0, "reserve_after_s": 600.0}  # fmt: skip


def claimer(url: str, name: str, start: Any, out: Any) -> None:
    engine = make_engine(url)
    start.wait()
    got = []
    while (claimed := store.claim_job(engine, worker_id=name, **CLAIM)) is not None:
        got.append(claimed.fence.job_id)
    out.put((name, got, time.perf_counter()))


def bare_claimer(url: str, name: str, start: Any, out: Any) -> None:
    """The same claim statement sent by psycopg itself (no SQLAlchemy, no pool, no pre-ping
    or result processing, a new lease token each time): what this database on this machine
    allows a Python client, so the figure above reads as a ratio."""
    # learns the SQL as claim_job sends it, and takes one job
    claimed, sql, params = claim_as_sent(make_engine(url), worker_id=name, **CLAIM)
    assert claimed is not None
    conn = psycopg.connect(make_url(url).set(drivername="postgresql").render_as_string(False))
    conn.autocommit = True
    got = [claimed.fence.job_id]
    start.wait()
    while True:
        row = conn.execute(sql, {**params, "token": secrets.token_hex(16)}).fetchone()
        if row is None:
            break
        got.append(row[0])
    out.put((name, got, time.perf_counter()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--users", type=int, default=50, help="owners of the jobs, round robin")
    parser.add_argument("--databases", default="sqlite:2,postgresql:4", help="kind:processes")
    parser.add_argument(
        "--no-bare", dest="bare", action="store_false", help="skip the bare psycopg run"
    )
    args = parser.parse_args()
    rows = []
    for spec in args.databases.split(","):
        kind, processes = spec.split(":")
        with tempfile.TemporaryDirectory() as tmp, database(kind) as url:
            if url is None:
                url = f"sqlite:///{Path(tmp) / 'claims.db'}"
                upgrade(url)
            rows.append(
                {"database": kind, **measure(url, args.jobs, int(processes), users=args.users)}
            )
        if kind == "postgresql" and args.bare:
            with database(kind) as url:
                assert url is not None
                bare = measure(url, args.jobs, int(processes), bare_claimer, users=args.users)
                rows.append({"database": "postgresql, bare psycopg", **bare})
    print_table("claims", rows)
    save("claims", rows)


def measure(
    url: str, jobs: int, processes: int, target: Any = claimer, *, users: int = 50
) -> dict[str, Any]:
    row = Job.model_validate(JobCreate(recipe="r").model_dump()).model_dump(exclude={"id"})
    names = [f"user{i:02d}" for i in range(users)]
    engine = make_engine(url)
    with write_session(engine) as session:
        session.execute(insert(User), [{"name": n} for n in names])
        owned = [{**row, "owner": names[i % users]} for i in range(jobs)]
        session.execute(insert(Job), owned)
    with engine.begin() as conn:  # the statistics autoanalyze keeps after such an insert
        conn.exec_driver_sql("ANALYZE job")
        conn.exec_driver_sql("ANALYZE trainyard_user")
    engine.dispose()
    ctx = mp.get_context("spawn")
    start, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=target, args=(url, f"w{i}", start, out)) for i in range(processes)]
    for p in procs:
        p.start()
    time.sleep(3)  # let every process import and connect before the clock starts
    began = time.perf_counter()
    start.set()
    results = [out.get() for _ in procs]
    for p in procs:
        p.join()
    ended = max(r[2] for r in results)
    claimed = [i for r in results for i in r[1]]
    return {
        "processes": processes,
        "jobs": jobs,
        "users": users,
        "claimed": len(claimed),
        "double_claims": len(claimed) - len(set(claimed)),
        "claims_per_s": len(claimed) / (ended - began),
        "per_process": {r[0]: len(r[1]) for r in results},
    }


if __name__ == "__main__":
    main()
