"""PostgreSQL goes away while jobs run: short outages cost nothing, long ones stop the
jobs the worker can no longer prove it owns; the API answers 503 meanwhile and recovers."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from tests.databases import ADMIN_URL, empty
from tests.stack import Stack, running_stack, wait_for
from workers.procfs import group_members

pytestmark = pytest.mark.slow

LONG_JOB = {
    "recipe": "tiny",
    "epochs": 20,
    "batch_size": 64,
    "params": {"samples": 1024, "sleep_per_step_s": 0.02},
}


@contextmanager
def database_down(url: str) -> Iterator[None]:
    """No connection to the database, old or new, until the block ends (a restart, as far
    as its clients can tell, without disturbing other databases on the server)."""
    name = make_url(url).database
    admin = create_engine(ADMIN_URL, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false'))
            conn.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = :name AND pid <> pg_backend_pid()"
                ),
                {"name": name},
            )
        yield
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true'))
        admin.dispose()


@pytest.fixture
def pg_stack(tmp_path: Path, postgres_url: str) -> Iterator[Stack]:
    empty(postgres_url)
    with running_stack(tmp_path, postgres_url) as stack:
        yield stack


def outage_noticed(stack: Stack, worker_id: str = "e2e") -> float:
    """Wait until the worker found the database gone (it logs that once per outage);
    returns when (monotonic)."""
    log = stack.tmp / f"worker-{worker_id}.log"
    # At its next heartbeat or claim: seconds, or more on a loaded box (15 s was passed
    # once while the gpu-check rehearsal's subprocesses took both cores).
    wait_for(lambda: "database unreachable" in log.read_text(), 60, "the worker to notice")
    return time.monotonic()


def running_with_progress(stack: Stack, job_id: int) -> None:
    wait_for(
        lambda: (j := stack.job(job_id))["status"] == "running" and j["progress"], 60, "progress"
    )


def test_outage_shorter_than_the_lease_costs_the_job_nothing(pg_stack: Stack) -> None:
    pg_stack.start_worker(lease_s=8)
    job = pg_stack.submit(**LONG_JOB)
    running_with_progress(pg_stack, job["id"])
    with database_down(pg_stack.database_url):
        r = pg_stack.http.get(f"/jobs/{job['id']}")
        assert r.status_code == 503, r.text
        assert "database is unavailable" in r.json()["detail"] and r.headers["Retry-After"]
        assert pg_stack.http.get(pg_stack.url + "/healthz").status_code == 503
        outage_noticed(pg_stack)  # its heartbeat failed: the job ran on without a renewal
    # the API recovers by itself, and the job was never given up
    wait_for(lambda: pg_stack.http.get(f"/jobs/{job['id']}").status_code == 200, 10, "API")
    done = pg_stack.wait_status(job["id"], {"succeeded", "failed"})
    assert (done["status"], done["attempt"]) == ("succeeded", 1), done


def test_outage_longer_than_the_lease_stops_the_job_then_it_runs_again(pg_stack: Stack) -> None:
    pg_stack.start_worker(lease_s=3)
    job = pg_stack.submit(**LONG_JOB)
    running_with_progress(pg_stack, job["id"])
    pgid = pg_stack.runner_pgid(job["id"])
    with database_down(pg_stack.database_url):
        # the worker cannot prove it owns the job any more: its processes must go
        wait_for(lambda: not group_members(pgid), 15, "the unowned attempt to be killed")
    done = pg_stack.wait_status(job["id"], {"succeeded", "failed"})
    assert (done["status"], done["attempt"]) == ("succeeded", 2), done


def test_an_idle_worker_through_a_long_outage_runs_the_next_job_normally(
    pg_stack: Stack,
) -> None:
    # A long heartbeat interval: the claim right after the outage comes before the next
    # renewal, as it does when a submit's notification wakes the worker.
    lease_s = 3
    pg_stack.start_worker(lease_s=lease_s, heartbeat_interval_s=2.5)
    with database_down(pg_stack.database_url):
        # two leases with no renewal, as the worker saw them: nothing was held, nothing to stop
        noticed = outage_noticed(pg_stack)
        wait_for(lambda: time.monotonic() > noticed + 2 * lease_s, 10, "two leases of outage")
    job = pg_stack.submit(recipe="tiny", epochs=2, params={"sleep_per_step_s": 0.01})
    done = pg_stack.wait_status(job["id"], {"succeeded", "failed"})
    assert (done["status"], done["attempt"]) == ("succeeded", 1), done
