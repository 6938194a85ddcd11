"""Limits a team's users meet: Idempotency-Keys are each user's own, the queued-jobs
limit holds however many submits race, a job larger than its owner's running quota is
refused at submit, and event streams are capped per user and in all; on both databases."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import Engine, func
from sqlmodel import select

from service import store
from service.app import create_app
from service.db import read_session
from service.errors import QueueQuotaReached
from service.models import Job, JobCreate, JobStatus
from service.settings import Settings
from tests.stack import serving, wait_for
from tests.team.test_users_and_tokens import ADMIN, ADMIN_TOKEN, SPEC, add_user, bearer

JOBS = "/api/v1/jobs"


@pytest.fixture
def team(settings: Settings, add_worker: Any) -> Settings:
    """A shared box's settings (a bootstrap admin token) with a two-slot CPU worker."""
    add_worker("box")
    return settings.model_copy(update={"api_token": ADMIN_TOKEN})


@pytest.fixture
def api(team: Settings, engine: Engine) -> Iterator[TestClient]:
    with TestClient(create_app(team, engine)) as client:
        yield client


def queued_of(engine: Engine, owner: str) -> int:
    with read_session(engine) as session:
        count = select(func.count()).where(Job.owner == owner, Job.status == JobStatus.queued)
        return int(session.exec(count).one())


def test_an_idempotency_key_is_each_users_own(api: TestClient) -> None:
    """carol's key named carol's job for alice too: alice's retry got carol's job back."""
    alice, carol = add_user(api, "alice"), add_user(api, "carol")
    key = {"Idempotency-Key": "nightly-train"}
    carols = api.post(JOBS, json=SPEC, headers={**bearer(carol), **key})
    assert carols.status_code == 201, carols.text
    alices = api.post(JOBS, json={**SPEC, "seed": 7}, headers={**bearer(alice), **key})
    assert alices.status_code == 201, alices.text
    assert alices.json()["owner"] == "alice" and alices.json()["id"] != carols.json()["id"]
    assert "idempotent-replayed" not in alices.headers
    again = api.post(JOBS, json={**SPEC, "seed": 7}, headers={**bearer(alice), **key})
    assert again.status_code == 201 and again.headers["idempotent-replayed"] == "true"
    assert again.json()["id"] == alices.json()["id"]
    # her own key with another spec is still a conflict: the key is hers
    r = api.post(JOBS, json={**SPEC, "seed": 8}, headers={**bearer(alice), **key})
    assert r.status_code == 409, r.text


def test_one_key_raced_by_two_owners_gives_each_one_job(engine: Engine) -> None:
    """Submits with one key from two owners at once, several of each: one job per owner,
    each of an owner's submits answered with it (a lost race finds the winner's row)."""

    def submit(i: int) -> tuple[str, int, bool]:
        owner = ("alice", "carol")[i % 2]
        job, created = store.create_job(
            engine, JobCreate(recipe="r"), owner=owner, idempotency_key="nightly-train"
        )
        assert job.id is not None
        return owner, job.id, created

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(submit, range(16)))
    ids = {
        owner: {job_id for o, job_id, _ in results if o == owner} for owner in ("alice", "carol")
    }
    assert len(ids["alice"]) == len(ids["carol"]) == 1 and ids["alice"] != ids["carol"]
    assert sum(created for _, _, created in results) == 2
    assert queued_of(engine, "alice") == queued_of(engine, "carol") == 1


async def burst(app: FastAPI, requests: list[tuple[str, dict[str, Any]]]) -> list[httpx.Response]:
    """POST these (token, extra headers) submits all at once through the real app."""
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        return await asyncio.gather(
            *(
                client.post(JOBS, json=SPEC, headers={**bearer(token), **extra})
                for token, extra in requests
            )
        )


def test_the_queued_limit_holds_under_a_burst_of_submits(team: Settings, engine: Engine) -> None:
    """With a limit of 3, a burst of 40 submits from one token got all 40 in: the count
    was read before the group commit's insert. Counted with the insert, exactly 3 get in,
    by either way in (batched, or with an Idempotency-Key in a transaction of its own);
    another user's submits in the same batches are not held back."""
    capped = team.model_copy(update={"max_queued_jobs_per_user": 3})
    app = create_app(capped, engine)
    with TestClient(app) as api:
        carol, dan = add_user(api, "carol"), add_user(api, "dan")
    requests = [(carol, {"Idempotency-Key": f"k{i}"} if i % 2 else {}) for i in range(40)]
    requests += [(dan, {}) for _ in range(3)]
    answers = asyncio.run(burst(app, requests))
    carols = [r.status_code for r in answers[:40]]
    assert sorted(carols) == [201] * 3 + [429] * 37, carols
    assert [r.status_code for r in answers[40:]] == [201] * 3
    refused = next(r for r in answers if r.status_code == 429)
    assert refused.headers["retry-after"]
    assert (
        "carol has 3 jobs queued, the most allowed (3, TRAINYARD_MAX_QUEUED_JOBS"
        in (refused.json()["detail"])
    )
    assert queued_of(engine, "carol") == 3 and queued_of(engine, "dan") == 3


def test_a_retry_at_the_limit_gets_its_job_back(team: Settings, engine: Engine) -> None:
    """A retried submit (its Idempotency-Key) at the limit is its first try's answer, not
    a 429: the key is looked up before the count."""
    capped = team.model_copy(update={"max_queued_jobs_per_user": 1})
    with TestClient(create_app(capped, engine)) as api:
        carol = add_user(api, "carol")
        first = api.post(JOBS, json=SPEC, headers={**bearer(carol), "Idempotency-Key": "a"})
        assert first.status_code == 201, first.text
        again = api.post(JOBS, json=SPEC, headers={**bearer(carol), "Idempotency-Key": "a"})
        assert again.status_code == 201 and again.json()["id"] == first.json()["id"]
        other = api.post(JOBS, json=SPEC, headers={**bearer(carol), "Idempotency-Key": "b"})
        assert other.status_code == 429, other.text


def test_a_retry_of_a_script_job_at_the_limit_gets_its_job_back(
    team: Settings, engine: Engine
) -> None:
    """The same for a job with its own code, whose queued limit is also counted before
    its inputs are checked: not for a retry, which the insert answers with its job."""
    from tests.team.test_blob_owners import digest_of, package, put, script_job

    capped = team.model_copy(update={"max_queued_jobs_per_user": 1})
    with TestClient(create_app(capped, engine)) as api:
        carol = add_user(api, "carol")
        put(api, carol, package())
        spec = script_job(digest_of(package()))
        first = api.post(JOBS, json=spec, headers={**bearer(carol), "Idempotency-Key": "a"})
        assert first.status_code == 201, first.text
        again = api.post(JOBS, json=spec, headers={**bearer(carol), "Idempotency-Key": "a"})
        assert again.status_code == 201 and again.json()["id"] == first.json()["id"], again.text
        other = api.post(JOBS, json=spec, headers={**bearer(carol), "Idempotency-Key": "b"})
        assert other.status_code == 429, other.text


def test_the_queued_limit_holds_for_concurrent_store_submits(engine: Engine) -> None:
    """The store's own rule, 100 submits from 16 threads: exactly the limit is inserted,
    whether a submit is batched or not; the rest are told the count and the limit."""
    limit = (3, "TRAINYARD_MAX_QUEUED_JOBS_PER_USER")

    def submit(i: int) -> str:
        try:
            store.create_job(
                engine,
                JobCreate(recipe="r", seed=i),
                owner="carol",
                idempotency_key=f"k{i}" if i % 3 == 0 else None,
                queue_limit=limit,
            )
        except QueueQuotaReached as refused:
            assert "carol has 3 jobs queued, the most allowed (3" in str(refused)
            return "refused"
        return "created"

    with ThreadPoolExecutor(max_workers=16) as pool:
        outcomes = list(pool.map(submit, range(100)))
    assert outcomes.count("created") == 3
    assert queued_of(engine, "carol") == 3


def test_a_job_larger_than_its_owners_running_quota_is_refused(
    team: Settings, engine: Engine
) -> None:
    """A job asking for more devices than its owner may hold at once was accepted and
    waited forever: it is refused at submit, naming the quota and where it is set."""
    with TestClient(create_app(team, engine)) as api:
        lee = add_user(api, "lee")
        r = api.patch("/api/v1/users/lee/quotas", json={"max_running_devices": 1}, headers=ADMIN)
        assert r.status_code == 200, r.text
        r = api.post(JOBS, json={**SPEC, "devices": 2}, headers=bearer(lee))
        assert r.status_code == 422, r.text
        [error] = r.json()["detail"]
        assert error["loc"] == ["body", "devices"]
        assert error["msg"].startswith(
            "the job needs 2 devices, more than lee's running quota of 1 (lee's own limit)"
        )
        assert api.post(JOBS, json=SPEC, headers=bearer(lee)).status_code == 201
        # the quota is its owner's: the admin has none; the default applies to everyone
        assert api.post(JOBS, json={**SPEC, "devices": 2}, headers=ADMIN).status_code == 201
    capped = team.model_copy(update={"max_running_devices_per_user": 1})
    with TestClient(create_app(capped, engine)) as api:
        r = api.post(JOBS, json={**SPEC, "devices": 2}, headers=ADMIN)
        assert r.status_code == 422, r.text
        assert "(TRAINYARD_MAX_RUNNING_DEVICES_PER_USER)" in r.json()["detail"][0]["msg"]
    with read_session(engine) as session:
        assert session.exec(select(func.count()).select_from(Job)).one() == 2


def test_event_streams_are_capped_per_user_and_in_all(team: Settings, engine: Engine) -> None:
    """500 streams from one non-admin token were all accepted: a user gets their cap, the
    server its own, each refusal a 429 with Retry-After; a closed stream frees its slot."""
    capped = team.model_copy(update={"max_event_streams_per_user": 2, "max_event_streams": 3})
    app = create_app(capped, engine)
    with TestClient(app) as api:
        alice, bob = add_user(api, "alice"), add_user(api, "bob")
        job = api.post(JOBS, json=SPEC, headers=bearer(alice)).json()
    events = f"{JOBS}/{job['id']}/events"
    with serving(app) as url, contextlib.ExitStack() as streams:
        client = streams.enter_context(httpx.Client(base_url=url, headers={"Host": "testserver"}))

        def open_stream(token: str) -> httpx.Response:
            response = streams.enter_context(client.stream("GET", events, headers=bearer(token)))
            if response.status_code != 200:
                response.read()  # a refusal's body is short: read it whole
            return response

        first, second = open_stream(alice), open_stream(alice)
        assert first.status_code == second.status_code == 200
        refused = open_stream(alice)
        assert refused.status_code == 429 and refused.headers["retry-after"] == "10"
        assert (
            "alice has 2 event streams open, the most allowed (2, TRAINYARD_MAX_EVENT"
            in (refused.json()["detail"])
        )
        assert open_stream(bob).status_code == 200  # another user's cap is their own
        refused = open_stream(bob)
        assert refused.status_code == 429, refused.text
        assert "(3, TRAINYARD_MAX_EVENT_STREAMS)" in refused.json()["detail"]
        first.close()  # alice's slot comes back once the server sees the stream gone:
        # at once, or at the latest when its next keepalive (every 15 s) cannot be sent
        wait_for(lambda: app.state.feeds.slots.total == 2, 30, "the closed stream's slot")
        assert open_stream(alice).status_code == 200
