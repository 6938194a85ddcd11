"""Fair share and quotas on the claim side: the usage score's arithmetic, the start order
of users with skewed backlogs, priority within a user, the running quota and the waiting
reasons, the usage listing. Real databases, both kinds."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, update
from sqlmodel import col

from service import fair_share, store
from service.catalog import load_catalog, waiting_reason
from service.db import read_session, write_session
from service.models import NO_USAGE, Job, JobCreate, JobStatus, User, utcnow
from service.reasons import ReasonCode as R
from service.store import Outcome

DAY_S = 24 * 3600.0
WEEK_S = 7 * DAY_S
CLAIM: dict[str, Any] = {
    "worker_id": "w",
    "free_devices": 1,
    "accelerator": "cpu",
    "recipes": ["tiny"],
    "lease_s": 30.0,
    "reserve_after_s": 600.0,
}


def user(engine: Engine, name: str, usage_s: float = 0.0, **quotas: Any) -> None:
    """A user row with this much usage now (PostgreSQL keeps users between tests: each
    test sets the ones it uses afresh)."""
    score = fair_share.score_of(usage_s, utcnow(), WEEK_S) if usage_s else NO_USAGE
    with write_session(engine) as session:
        session.merge(User(name=name, usage_score=score, **quotas))


def enqueue(engine: Engine, owner: str, n: int = 1, **spec: Any) -> list[int]:
    """``n`` queued jobs of ``owner`` (the API sets the owner from the token)."""
    ids = []
    for _ in range(n):
        job, _ = store.create_job(engine, JobCreate(recipe="tiny", **spec))
        assert job.id is not None
        ids.append(job.id)
    with write_session(engine) as session:
        session.execute(update(Job).where(col(Job.id).in_(ids)).values(owner=owner))
    return ids


def start_order(engine: Engine, **claim: Any) -> list[tuple[str, int]]:
    """Claim until nothing is left: (owner, job id) in the order they started."""
    order = []
    while (claimed := store.claim_job(engine, **{**CLAIM, **claim})) is not None:
        order.append((claimed.owner, claimed.fence.job_id))
    return order


# --- the score ----------------------------------------------------------------------


def test_a_charge_adds_device_seconds_and_they_decay_by_the_half_life() -> None:
    now = fair_share.EPOCH + timedelta(days=400)
    score = fair_share.charged(NO_USAGE, 3600.0, now, WEEK_S)
    assert math.isclose(fair_share.usage_at(score, now, WEEK_S), 3600.0)
    score = fair_share.charged(score, 1800.0, now, WEEK_S)
    assert math.isclose(fair_share.usage_at(score, now, WEEK_S), 5400.0)
    later = now + timedelta(weeks=1)
    assert math.isclose(fair_share.usage_at(score, later, WEEK_S), 2700.0)
    # a charge a week later adds to the decayed usage
    score = fair_share.charged(score, 300.0, later, WEEK_S)
    assert math.isclose(fair_share.usage_at(score, later, WEEK_S), 3000.0)
    assert math.isclose(fair_share.usage_at(score, later + timedelta(weeks=2), WEEK_S), 750.0)


def test_no_usage_is_zero_and_below_every_score() -> None:
    now = fair_share.EPOCH
    assert fair_share.usage_at(NO_USAGE, now, WEEK_S) == 0.0
    assert fair_share.charged(NO_USAGE, 0.0, now, WEEK_S) == NO_USAGE
    assert fair_share.score_of(1e-6, fair_share.EPOCH - timedelta(days=3650), 60.0) > NO_USAGE


def test_scores_order_users_as_their_usage_now_whenever_charged() -> None:
    """Ordered by score is ordered by decayed usage, however long ago each was charged,
    and no score overflows decades on."""
    base = fair_share.EPOCH + timedelta(days=30)
    charges = [(1e6, 0.0), (5e5, 3.0), (2e5, 10.0), (10.0, 0.5), (9e5, 1.0)]  # (d-s, days)
    scores = [fair_share.charged(NO_USAGE, d, base + timedelta(days=t), WEEK_S) for d, t in charges]
    now = base + timedelta(days=12)
    usage = [fair_share.usage_at(s, now, WEEK_S) for s in scores]
    assert sorted(range(5), key=scores.__getitem__) == sorted(range(5), key=usage.__getitem__)
    assert math.isclose(usage[0], 1e6 * 2 ** (-12 / 7))
    decades = fair_share.charged(scores[0], 1.0, base + timedelta(days=365 * 50), WEEK_S)
    assert math.isfinite(decades) and decades < 3000


# --- the claim's order -----------------------------------------------------------------


def test_a_light_users_job_starts_before_a_heavy_users_backlog(engine: Engine) -> None:
    """Skewed backlogs: alice 30 jobs queued first and a week of GPU time, bob 5 and an
    hour, carol 1 and nothing. Carol's starts first, then bob's, then alice's."""
    user(engine, "alice", usage_s=7 * DAY_S)
    user(engine, "bob", usage_s=3600.0)
    user(engine, "carol")
    alice = enqueue(engine, "alice", 30)
    bob = enqueue(engine, "bob", 5)
    carol = enqueue(engine, "carol", 1)
    assert start_order(engine) == (
        [("carol", i) for i in carol] + [("bob", i) for i in bob] + [("alice", i) for i in alice]
    )


def test_charges_between_claims_interleave_the_users(engine: Engine) -> None:
    """As the heartbeats charge each started job's owner, the lighter user leads in turn."""
    user(engine, "alice", usage_s=1000.0)
    user(engine, "bob")
    enqueue(engine, "alice", 3)
    enqueue(engine, "bob", 3)
    order = []
    while (claimed := store.claim_job(engine, **CLAIM)) is not None:
        order.append(claimed.owner)
        store.charge_usage(engine, {claimed.owner: 600.0}, utcnow(), WEEK_S)
    # bob 0 -> 600 -> 1200 > alice 1000 -> 1600 > bob 1200 -> 1800 > alice 1600 ...
    assert order == ["bob", "bob", "alice", "bob", "alice", "alice"]


def test_priority_orders_a_users_own_jobs_not_other_users(engine: Engine) -> None:
    user(engine, "alice", usage_s=DAY_S)
    user(engine, "bob")
    low, high, middle = (enqueue(engine, "alice", priority=p)[0] for p in (0, 9, 5))
    [bobs] = enqueue(engine, "bob", priority=-5)
    assert [i for _, i in start_order(engine)] == [bobs, high, middle, low]


def test_the_queue_position_counts_fair_shares_order(engine: Engine) -> None:
    user(engine, "alice", usage_s=DAY_S)
    user(engine, "carol")
    alice = enqueue(engine, "alice", 4)
    carol = enqueue(engine, "carol", 2)
    with read_session(engine) as session:
        positions = [
            store.queue_position(session, store.get_job(session, i)) for i in alice + carol
        ]
        standing = store.queue_standing(session, store.get_job(session, alice[1]))
    assert positions == [3, 4, 5, 6, 1, 2]
    assert standing == store.Standing(4, 2, 0, None)


# --- quotas ------------------------------------------------------------------------------


def test_the_running_quota_holds_a_users_jobs_back_while_others_run(
    engine: Engine, add_worker: Any
) -> None:
    """alice (least usage) may hold 2 devices (the default) and bob 1 (his own); carol
    has no more than the default either. With 8 free devices, alice's third job waits,
    reason quota, until one of hers ends."""
    user(engine, "alice")
    user(engine, "bob", usage_s=60.0, max_running_devices=1)
    user(engine, "carol", usage_s=3600.0)
    alice = enqueue(engine, "alice", 3)
    bob = enqueue(engine, "bob", 2)
    [carols] = enqueue(engine, "carol", devices=2)
    quota = {"free_devices": 8, "max_running_devices": 2}
    started = start_order(engine, **quota)
    assert started == [("alice", alice[0]), ("alice", alice[1]), ("bob", bob[0]), ("carol", carols)]

    add_worker(slots=8)
    with read_session(engine) as session:
        catalog = load_catalog(session)
        reasons = {}
        for job_id in (alice[2], bob[1]):
            job = store.get_job(session, job_id)
            standing = store.queue_standing(session, job, max_running_devices=2)
            assert standing is not None
            reasons[job_id] = waiting_reason(catalog, job, standing.position, standing)
    assert reasons[alice[2]].code == R.quota
    assert reasons[alice[2]].message == (
        "waiting: alice's jobs hold 2 of their 2 devices (quota); this one needs 1"
    )
    assert reasons[bob[1]].code == R.quota
    assert "bob's jobs hold 1 of their 1 devices" in reasons[bob[1]].message

    first = store.load_job(engine, alice[0])
    fence = store.Fence(alice[0], first.attempt, first.lease_token or "")
    store.finish_attempt(engine, fence, Outcome(JobStatus.succeeded, R.succeeded, "trained"))
    assert start_order(engine, **quota) == [("alice", alice[2])]


def test_a_user_at_quota_does_not_reserve_the_devices(engine: Engine) -> None:
    """The reservation is the head user's, among jobs within quota: an old job held back by
    its owner's quota does not keep the devices from others."""
    user(engine, "alice")
    user(engine, "bob", usage_s=3600.0)
    alice = enqueue(engine, "alice", 2)
    [bobs] = enqueue(engine, "bob")
    starving = {"free_devices": 4, "max_running_devices": 1, "reserve_after_s": 0.0}
    assert start_order(engine, **starving) == [("alice", alice[0]), ("bob", bobs)]


def test_a_light_users_queued_job_says_it_waits_behind_fair_share(
    engine: Engine, add_worker: Any
) -> None:
    user(engine, "alice", usage_s=3600.0)
    user(engine, "carol")
    [alices] = enqueue(engine, "alice")
    enqueue(engine, "carol", 2)
    add_worker()
    with read_session(engine) as session:
        job = store.get_job(session, alices)
        standing = store.queue_standing(session, job)
        assert standing is not None
        reason = waiting_reason(load_catalog(session), job, standing.position, standing)
    assert reason.code == R.queued
    assert reason.message == (
        "waiting for 1 free device(s); behind other users' fair share: 2 job(s) ahead, 2 of them "
        "of users with less recent usage"
    )


def test_queued_count_and_usage_by_user(engine: Engine) -> None:
    user(engine, "alice", usage_s=DAY_S, max_queued_jobs=10)
    user(engine, "bob", usage_s=3600.0)
    enqueue(engine, "alice", 3)
    enqueue(engine, "bob", 2, devices=2)
    assert store.claim_job(engine, **{**CLAIM, "free_devices": 2}) is not None  # bob's
    with read_session(engine) as session:
        assert store.queued_count(session, "alice") == 3
        assert store.queued_count(session, "bob") == 1
        rows = store.usage_by_user(session, utcnow(), WEEK_S, default_max_running=4)
    mine = [r for r in rows if r.name in ("alice", "bob")]
    assert [(r.name, r.running_devices, r.queued_jobs) for r in mine] == [
        ("bob", 2, 1),
        ("alice", 0, 3),
    ]
    assert math.isclose(mine[1].usage_device_s, DAY_S, rel_tol=1e-3)
    assert (mine[1].max_running_devices, mine[1].max_queued_jobs) == (4, 10)


@pytest.mark.parametrize("path", ["/api/v1/users/usage", "/metrics"])
def test_usage_is_visible_in_the_api_and_prometheus(
    client: TestClient, engine: Engine, path: str
) -> None:
    user(engine, "alice", usage_s=DAY_S)
    enqueue(engine, "alice", 2)
    response = client.get(path)
    assert response.status_code == 200, response.text
    if path == "/metrics":
        [line] = [
            line
            for line in response.text.splitlines()
            if line.startswith('trainyard_user_usage_device_seconds{user="alice"}')
        ]
        assert math.isclose(float(line.split()[-1]), DAY_S, rel_tol=1e-3)
        return
    [alice] = [u for u in response.json() if u["name"] == "alice"]
    assert alice["queued_jobs"] == 2
    assert math.isclose(alice["usage_device_s"], DAY_S, rel_tol=1e-3)


def test_a_job_of_no_known_user_is_neither_claimed_nor_pending(engine: Engine) -> None:
    """The claim walks the users: a job whose owner has no user row is never taken, so a
    draining worker does not wait for it either."""
    enqueue(engine, "nobody")
    assert store.claim_job(engine, **CLAIM) is None
    assert store.pending_count(engine, max_devices=1, accelerator="cpu", recipes=["tiny"]) == 0
