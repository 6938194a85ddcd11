"""The dispatcher, on both databases, against real receivers on 127.0.0.1: a signed
delivery, a failed attempt retried after its back-off and then given up, an address
refused at send time, Slack's body, claims that two processes cannot share, pruning."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, event, select, update
from sqlmodel import col

from service import store
from service.db import read_session, write_session
from service.models import JobCreate, utcnow
from service.webhooks import deliveries
from service.webhooks.deliveries import Attempt
from service.webhooks.models import WebhookDelivery
from tests.service.webhooks.receiver import Receiver, receiving
from trainyard.signatures import BadSignature, verify

HOOKS = "/api/v1/webhooks"
Dispatch = Callable[..., None]


def add_hook(client: TestClient, url: str, **fields: Any) -> dict[str, Any]:
    r = client.post(HOOKS, json={"url": url, **fields})
    assert r.status_code == 201, r.text
    return r.json()  # type: ignore[no-any-return]


def end_a_job(engine: Engine, name: str = "nightly") -> int:
    job, _ = store.create_job(engine, JobCreate.model_validate({"recipe": "r", "name": name}))
    assert job.id is not None
    store.cancel_job(engine, job.id)
    return job.id


def shown(client: TestClient, hook: dict[str, Any]) -> list[dict[str, Any]]:
    return client.get(f"{HOOKS}/{hook['id']}").json()["deliveries"]  # type: ignore[no-any-return]


def make_due(engine: Engine) -> None:
    """A retry's back-off, over (the test does not wait it out)."""
    with write_session(engine) as session:
        session.execute(update(WebhookDelivery).values(next_attempt_at=utcnow()))


def test_a_delivery_is_signed_and_sent_once(
    loopback_client: TestClient, engine: Engine, receiver: Receiver, dispatch: Dispatch
) -> None:
    hook = add_hook(loopback_client, receiver.url)
    job_id = end_a_job(engine)
    dispatch()
    [got] = receiver.got()
    [delivery] = shown(loopback_client, hook)
    h = got.headers
    verify(hook["secret"], got.body, h["X-Trainyard-Timestamp"], h["X-Trainyard-Signature"])
    with pytest.raises(BadSignature):
        verify("another secret", got.body, h["X-Trainyard-Timestamp"], h["X-Trainyard-Signature"])
    assert h["X-Trainyard-Event"] == "job.cancelled"
    assert h["X-Trainyard-Delivery"] == str(delivery["id"])
    assert h["Content-Type"] == "application/json" and h["User-Agent"] == "Trainyard-Webhooks"
    assert h["Host"] == f"127.0.0.1:{receiver.port}"
    body = got.json
    assert body["event"] == "job.cancelled" and body["job"]["id"] == job_id
    assert body["delivery"] == delivery["id"], "the id is signed with the body"
    assert delivery["state"] == "delivered" and delivery["attempts"] == 1
    assert delivery["last_status_code"] == 200 and delivery["delivered_at"]
    dispatch()  # nothing due: nothing sent again
    assert len(receiver.got()) == 1


def test_a_failed_attempt_is_retried_with_the_same_id_then_given_up(
    loopback_client: TestClient, engine: Engine, dispatch: Dispatch
) -> None:
    with receiving(Receiver(status=500)) as refusing:
        hook = add_hook(loopback_client, refusing.url)
        end_a_job(engine)
        before = utcnow()
        dispatch(webhook_max_attempts=3, webhook_retry_base_s=60)
        [delivery] = shown(loopback_client, hook)
        assert delivery["state"] == "pending" and delivery["attempts"] == 1
        assert delivery["last_status_code"] == 500
        assert delivery["last_error"] == "attempt 1: HTTP 500"
        due = datetime.fromisoformat(delivery["next_attempt_at"])
        assert due >= before + timedelta(seconds=60)  # its back-off: not due yet
        dispatch(webhook_max_attempts=3, webhook_retry_base_s=60)
        assert len(refusing.got()) == 1
        for _ in range(2):
            make_due(engine)
            dispatch(webhook_max_attempts=3, webhook_retry_base_s=60)
        [delivery] = shown(loopback_client, hook)
        assert delivery["state"] == "failed" and delivery["attempts"] == 3
        assert delivery["last_error"] == "attempt 3: HTTP 500"
        assert len({r.delivery for r in refusing.got()}) == 1 and len(refusing.got()) == 3


def test_the_back_off_doubles_up_to_an_hour() -> None:
    assert [deliveries.retry_delay_s(n, 5) for n in (1, 2, 3, 4)] == [5, 10, 20, 40]
    assert deliveries.retry_delay_s(20, 5) == 3600


def test_a_redirect_is_not_followed(
    loopback_client: TestClient, engine: Engine, dispatch: Dispatch
) -> None:
    with receiving(Receiver(status=307)) as redirecting:
        hook = add_hook(loopback_client, redirecting.url)
        end_a_job(engine)
        dispatch()
    [delivery] = shown(loopback_client, hook)
    assert delivery["state"] == "pending" and delivery["last_status_code"] == 307
    assert "not followed" in delivery["last_error"]


def test_a_name_that_resolves_to_loopback_when_sent_is_not_sent(
    loopback_client: TestClient, engine: Engine, receiver: Receiver, dispatch: Dispatch
) -> None:
    # taken while the server allowed private addresses; sent once it no longer does
    hook = add_hook(loopback_client, f"http://localhost:{receiver.port}/hook")
    end_a_job(engine)
    dispatch(webhook_allow_private_addresses=False)
    assert receiver.got() == []
    [delivery] = shown(loopback_client, hook)
    assert delivery["state"] == "failed" and delivery["attempts"] == 1
    assert delivery["last_status_code"] is None
    error = delivery["last_error"]
    assert error.startswith("attempt 1: not sent: localhost resolves to ") and "loopback" in error


def test_slack_gets_one_line_of_text(
    loopback_client: TestClient, engine: Engine, receiver: Receiver, dispatch: Dispatch
) -> None:
    hook = add_hook(loopback_client, receiver.url, format="slack", events=["job.cancelled"])
    job_id = end_a_job(engine, name="<!channel> & co")
    dispatch()
    [got] = receiver.got()
    assert json.loads(got.body) == {
        "text": f"Job {job_id} (&lt;!channel&gt; &amp; co) cancelled — owner admin"
    }
    h = got.headers  # signed all the same
    verify(hook["secret"], got.body, h["X-Trainyard-Timestamp"], h["X-Trainyard-Signature"])


def test_a_ping_reaches_the_receiver(
    loopback_client: TestClient, receiver: Receiver, dispatch: Dispatch
) -> None:
    hook = add_hook(loopback_client, receiver.url, events=["job.failed"])
    loopback_client.post(f"{HOOKS}/{hook['id']}/ping")
    dispatch()
    [got] = receiver.got()
    assert got.json["event"] == "webhook.ping" and got.json["webhook"]["id"] == hook["id"]


def test_a_claimed_delivery_is_no_one_elses_until_its_lease_runs_out(
    loopback_client: TestClient, engine: Engine, receiver: Receiver
) -> None:
    add_hook(loopback_client, receiver.url)
    end_a_job(engine)
    [first] = deliveries.claim_due(engine, 10, lease_s=60)
    assert deliveries.claim_due(engine, 10, lease_s=60) == []  # another process finds none
    with write_session(engine) as session:  # the first process stalled past its lease
        lapsed = utcnow() - timedelta(seconds=1)
        session.execute(update(WebhookDelivery).values(claimed_until=lapsed))
    [second] = deliveries.claim_due(engine, 10, lease_s=60)
    assert second.id == first.id and second.claimed_until != first.claimed_until
    sent = Attempt(delivered=True, status_code=200)
    options: dict[str, Any] = {"retry_base_s": 5.0, "max_attempts": 10}
    assert deliveries.record(engine, first, sent, **options) is None  # not its claim now
    assert deliveries.record(engine, second, sent, **options) == "delivered"
    deliveries.release(engine, [second])  # too late to hand back: recorded
    assert deliveries.claim_due(engine, 10, lease_s=60) == []


def test_old_deliveries_are_pruned_past_the_newest_of_each_webhook(
    loopback_client: TestClient, engine: Engine, receiver: Receiver, dispatch: Dispatch
) -> None:
    hook = add_hook(loopback_client, receiver.url)
    other = add_hook(loopback_client, receiver.url)
    for _ in range(4):
        loopback_client.post(f"{HOOKS}/{hook['id']}/ping")
    loopback_client.post(f"{HOOKS}/{other['id']}/ping")
    dispatch()
    loopback_client.post(f"{HOOKS}/{hook['id']}/ping")  # pending: never pruned
    kept = [d["id"] for d in shown(loopback_client, hook)]
    assert deliveries.prune(engine, keep=2) == 2
    assert [d["id"] for d in shown(loopback_client, hook)] == kept[:3]
    assert len(shown(loopback_client, other)) == 1


def test_deleting_a_webhook_deletes_its_deliveries(
    loopback_client: TestClient, engine: Engine
) -> None:
    hook = add_hook(loopback_client, "http://127.0.0.1:9/hook")
    end_a_job(engine)
    assert loopback_client.delete(f"{HOOKS}/{hook['id']}").status_code == 204
    with read_session(engine) as session:
        left = select(WebhookDelivery).where(col(WebhookDelivery.webhook_id) == hook["id"])
        assert session.execute(left).all() == []


def test_an_idle_poll_is_one_indexed_read(engine: Engine) -> None:
    sent: list[tuple[str, Any]] = []

    def keep(_c: Any, _cur: Any, statement: str, params: Any, _ctx: Any, _many: bool) -> None:
        if "webhook" in statement:
            sent.append((statement, params))

    event.listen(engine, "before_cursor_execute", keep)
    try:
        assert deliveries.claim_due(engine, 16, lease_s=40) == []
    finally:
        event.remove(engine, "before_cursor_execute", keep)
    [(statement, params)] = sent  # no write, no lock
    assert statement.startswith("SELECT")
    if engine.dialect.name != "sqlite":
        return  # PostgreSQL plans an empty table by cost
    with engine.connect() as conn:
        plan = conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {statement}", params).all()
    assert [row[-1] for row in plan] == [
        "SEARCH webhook_delivery USING INDEX ix_webhook_delivery_due (next_attempt_at<?)"
    ]


def test_no_password_or_path_of_a_webhooks_url_reaches_the_logs(
    loopback_client: TestClient,
    engine: Engine,
    receiver: Receiver,
    dispatch: Dispatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    url = f"http://user:hunter2@127.0.0.1:{receiver.port}/services/T0/B0/pathsecret"
    add_hook(loopback_client, url)
    with receiving(Receiver(status=500)) as refusing:
        add_hook(loopback_client, f"http://user:hunter2@127.0.0.1:{refusing.port}/pathsecret")
        end_a_job(engine)
        with caplog.at_level(logging.DEBUG):
            dispatch()
    [got] = receiver.got()
    assert got.headers["Authorization"].startswith("Basic ")  # the URL's user was sent
    assert "HTTP Request" in caplog.text and "attempt 1 failed" in caplog.text
    assert "hunter2" not in caplog.text and "pathsecret" not in caplog.text
