"""Fair share: the start order of users with skewed backlogs, and what it costs a claim.

1. Order: alice has 30 jobs queued first and a week of device-time behind her, bob 5 and
   an hour, carol 1 and none. One device, claimed job after job; each start charges its
   owner an hour (as the heartbeats would while it ran).
2. Cost: the claim (fair share, quotas, the head user's reservation) against a plain
   priority-then-age claim of the same jobs (the statement before fair share, minus the
   reservation), alternating batches in one process on one queue of 10,000 jobs of 50
   users; CPU and wall time per claim.

python -m benchmarks.fair_share [--jobs 10000] [--users 50] [--rounds 10] [--batch 200]
    [--databases sqlite,postgresql]
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import tempfile
import time
from datetime import timedelta
from itertools import groupby
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, insert, select

from benchmarks.common import database, print_table, save
from service import fair_share, store
from service.db import make_engine, statement_connection, write_session
from service.jobspec import served_accelerators
from service.migrate import upgrade
from service.models import NO_USAGE, Job, JobCreate, User, utcnow
from service.store import claim as claim_sql
from service.store.tables import job_table

HALF_LIFE_S = 7 * 24 * 3600.0
CLAIM: dict[str, Any] = {"free_devices": 1, "total_devices": 1, "accelerator": "cpu",
                         "recipes": ["r"], "lease_s": 60.0, "reserve_after_s": 600.0}  # fmt: skip
BACKLOGS = {"alice": (30, 7 * 24 * 3600.0), "bob": (5, 3600.0), "carol": (1, 0.0)}
# What a CPU worker offering recipe "r" claims with, as the statements' parameters.
SHAPE, OFFER = claim_sql._shape_params(served_accelerators("cpu"), ["r"])


def queue(engine: Engine, owners: list[str], jobs: int) -> None:
    """``jobs`` queued jobs, their owners round robin."""
    row = Job.model_validate(JobCreate(recipe="r").model_dump()).model_dump(exclude={"id"})
    with write_session(engine) as session:
        owned = [{**row, "owner": owners[i % len(owners)]} for i in range(jobs)]
        session.execute(insert(Job), owned)


def start_order(url: str) -> str:
    """Who starts in what order, as runs ("carol×1, bob×5, ...")."""
    engine = make_engine(url)
    now = utcnow()
    with write_session(engine) as session:
        for name, (_, usage_s) in BACKLOGS.items():
            score = fair_share.score_of(usage_s, now, HALF_LIFE_S) if usage_s else NO_USAGE
            session.merge(User(name=name, usage_score=score))
    for name, (n, _) in BACKLOGS.items():  # alice's first: the oldest
        queue(engine, [name], n)
    started = []
    while (claimed := store.claim_job(engine, worker_id="w", **CLAIM)) is not None:
        started.append(claimed.owner)
        store.charge_usage(engine, {claimed.owner: 3600.0}, utcnow(), HALF_LIFE_S)
    engine.dispose()
    return ", ".join(f"{who}×{len(list(run))}" for who, run in groupby(started))


def _plain() -> Any:
    """The claim before fair share, without the reservation: the best queued job by
    priority, then age, through ix_job_claim."""
    candidate = job_table.alias("candidate")
    target = (
        select(candidate.c.id)
        .where(*claim_sql._claimable(candidate, "free", "gpu_room", SHAPE))
        .order_by(candidate.c.priority.desc(), candidate.c.id)
        .limit(1)
        .with_for_update(skip_locked=True)
        .scalar_subquery()
    )
    return claim_sql.take(target)


PLAIN = _plain()


def plain_claim(engine: Engine) -> Any:
    """``store.claim_job``'s path (parameters, connection, one statement) with PLAIN."""
    now = utcnow()
    params = {
        **OFFER,
        **{"free": 1, "total": 1, "gpu_room": 0.0, "gpu_total": 0.0, "now": now},
        **{"worker": "w", "token": secrets.token_hex(16), "message": "attempt running on w"},
        "expires": now + timedelta(seconds=60),
    }
    with statement_connection(engine) as conn:
        return conn.execute(PLAIN, params).one_or_none()


def fair_claim(engine: Engine) -> Any:
    return store.claim_job(engine, worker_id="w", **CLAIM)


def cost(url: str, jobs: int, users: int, rounds: int, batch: int) -> dict[str, Any]:
    """Per-claim CPU and wall time, fair share vs plain, alternating batches."""
    engine = make_engine(url)
    names = [f"user{i:02d}" for i in range(users)]
    with write_session(engine) as session:
        session.execute(insert(User), [{"name": n} for n in names])
    queue(engine, names, jobs)
    with engine.begin() as conn:
        conn.exec_driver_sql("ANALYZE job")
        conn.exec_driver_sql("ANALYZE trainyard_user")
    sides = {"fair share": fair_claim, "plain priority": plain_claim}
    cpu: dict[str, list[float]] = {s: [] for s in sides}
    wall: dict[str, list[float]] = {s: [] for s in sides}
    for claim in sides.values():  # warm both
        for _ in range(20):
            assert claim(engine) is not None
    for _ in range(rounds):
        for side, claim in sides.items():
            c0, w0 = time.process_time(), time.perf_counter()
            for _ in range(batch):
                assert claim(engine) is not None
            cpu[side].append((time.process_time() - c0) / batch * 1e6)
            wall[side].append((time.perf_counter() - w0) / batch * 1e6)
    engine.dispose()
    row: dict[str, Any] = {"jobs": jobs, "users": users, "rounds": rounds, "batch": batch}
    for side in sides:
        row[f"{side} CPU us"] = statistics.median(cpu[side])
        row[f"{side} wall us"] = statistics.median(wall[side])
    row["CPU ratio"] = row["fair share CPU us"] / row["plain priority CPU us"]
    row["wall ratio"] = row["fair share wall us"] / row["plain priority wall us"]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--users", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--batch", type=int, default=200)
    parser.add_argument("--databases", default="sqlite,postgresql")
    args = parser.parse_args()
    rows = []
    for kind in args.databases.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            with database(kind) as url:
                if url is None:
                    url = f"sqlite:///{Path(tmp) / 'order.db'}"
                    upgrade(url)
                order = start_order(url)
            with database(kind) as url:
                if url is None:
                    url = f"sqlite:///{Path(tmp) / 'cost.db'}"
                    upgrade(url)
                measured = cost(url, args.jobs, args.users, args.rounds, args.batch)
        rows.append({"database": kind, "start order": order, **measured})
    print_table("fair share", rows)
    save("fair_share", rows)


if __name__ == "__main__":
    main()
