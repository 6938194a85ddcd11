"""Fair share's charge, by a real supervisor (in this process, on SQLite, real runners):
while a job runs its owner's usage grows at each heartbeat, and once it ended the usage
is its devices times the time it held them."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine, select

from service import fair_share, store
from service.db import read_session, write_session
from service.models import NO_USAGE, JobCreate, User, utcnow
from service.settings import Settings
from tests.stack import wait_for
from tests.workers.supervisor.test_supervisor import SLOW, InThread, engine, settings  # noqa: F401
from workers.supervisor.loop import Supervisor

# (engine, settings: the supervisor tests' fixtures, a migrated SQLite file, the test
# recipes, two CPU slots)

pytestmark = pytest.mark.slow


def score(db: Engine, name: str) -> float:
    """The user's fair-share score as stored."""
    with read_session(db) as session:
        query = select(User.usage_score).where(User.name == name)
        return float(session.execute(query).scalar_one())


def test_a_running_job_charges_its_owner_at_each_heartbeat(
    settings: Settings,  # noqa: F811
    engine: Engine,  # noqa: F811
) -> None:
    with write_session(engine) as session:
        session.merge(User(name="alice"))
    job, _ = store.create_job(
        engine, JobCreate(recipe="tiny", epochs=1, params=SLOW), owner="alice"
    )
    assert job.id is not None
    job_id = job.id
    worker = InThread(Supervisor(settings, worker_id="t"))
    seen: set[float] = set()

    def charged_twice_while_running() -> bool:
        now = score(engine, "alice")
        if store.load_job(engine, job_id).status == "running" and now > NO_USAGE:
            seen.add(now)
        return len(seen) >= 2  # the finish charges once: the rest were heartbeats

    wait_for(charged_twice_while_running, 60, "two charges while the job runs")
    worker.join(120)
    ended = store.load_job(engine, job_id)
    assert ended.status == "succeeded"
    assert ended.started_at is not None and ended.finished_at is not None
    held_s = (ended.finished_at - ended.started_at).total_seconds()
    half_life_s = settings.fair_share_half_life_s
    usage = fair_share.usage_at(score(engine, "alice"), utcnow(), half_life_s)
    # one CPU slot, from the runner's start to its finish being recorded
    assert 0.5 * held_s <= usage <= held_s + 1.0
