"""Webhooks through a real server and worker, to real receivers on 127.0.0.1: a job's end
arrives signed; a receiver that was down gets its delivery once it is up, once; one that
never answers holds up neither submits nor another webhook's delivery.

One server for the file (SQLite: nothing here depends on the database; the outbox and
the dispatcher's statements run on both in tests/service/webhooks/), with private
addresses allowed, since the receivers are on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.service.webhooks.receiver import Receiver, receiving
from tests.stack import Stack, free_port, running_stack, wait_for
from trainyard.signatures import verify

pytestmark = pytest.mark.slow

TINY: dict[str, Any] = {"recipe": "tiny", "epochs": 1, "batch_size": 8, "params": {"samples": 16}}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp: Path = tmp_path_factory.mktemp("webhooks")
    with running_stack(
        tmp,
        webhook_allow_private_addresses=1,
        webhook_retry_base_s=0.2,  # a receiver down is tried again soon
        webhook_timeout_s=120,  # a receiver that hangs holds its attempt for the whole test
        webhook_poll_s=0.2,
    ) as s:
        s.start_worker()
        yield s


@pytest.fixture
def hooks(stack: Stack) -> Iterator[list[dict[str, Any]]]:
    """The webhooks a test adds: deleted after it, so no other test's jobs reach them."""
    added: list[dict[str, Any]] = []
    yield added
    for hook in added:
        stack.http.delete(f"/webhooks/{hook['id']}")


def add_hook(stack: Stack, hooks: list[dict[str, Any]], url: str, **fields: Any) -> dict[str, Any]:
    r = stack.http.post("/webhooks", json={"url": url, **fields})
    assert r.status_code == 201, r.text
    hooks.append(r.json())
    return r.json()  # type: ignore[no-any-return]


def deliveries(stack: Stack, hook: dict[str, Any]) -> list[dict[str, Any]]:
    return stack.http.get(f"/webhooks/{hook['id']}").json()["deliveries"]  # type: ignore[no-any-return]


def test_a_jobs_end_arrives_signed(stack: Stack, hooks: list[dict[str, Any]]) -> None:
    with receiving() as receiver:
        hook = add_hook(stack, hooks, receiver.url, events=["job.succeeded", "job.failed"])
        job = stack.submit(**TINY, name="signed")
        [got] = wait_for(lambda: receiver.got(), 60, "the job's end at the receiver")
        h = got.headers
        verify(hook["secret"], got.body, h["X-Trainyard-Timestamp"], h["X-Trainyard-Signature"])
        assert h["X-Trainyard-Event"] == "job.succeeded"
        body = got.json
        assert body["event"] == "job.succeeded" and body["job"]["id"] == job["id"]
        assert body["job"]["status"] == "succeeded" and body["job"]["name"] == "signed"
        assert body["job"]["url_path"] == f"/api/v1/jobs/{job['id']}"
        [delivery] = wait_for(
            lambda: [d for d in deliveries(stack, hook) if d["state"] == "delivered"],
            30,
            "the delivery recorded",
        )
        assert h["X-Trainyard-Delivery"] == str(delivery["id"]) and delivery["attempts"] == 1
        assert stack.job(job["id"])["status"] == "succeeded"


def test_a_receiver_down_then_up_gets_its_delivery_once(
    stack: Stack, hooks: list[dict[str, Any]]
) -> None:
    port = free_port()  # nothing listens there yet
    hook = add_hook(stack, hooks, f"http://127.0.0.1:{port}/hook")
    ping = stack.http.post(f"/webhooks/{hook['id']}/ping").json()

    def failed_once() -> dict[str, Any] | None:
        [d] = deliveries(stack, hook)
        return d if d["attempts"] >= 1 else None

    failed = wait_for(failed_once, 30, "a first attempt to fail")
    assert failed["state"] == "pending" and "ConnectError" in failed["last_error"]
    with receiving(port=port) as receiver:

        def delivered() -> dict[str, Any] | None:
            [d] = deliveries(stack, hook)
            return d if d["state"] == "delivered" else None

        done = wait_for(delivered, 30, "the delivery once the receiver is up")
        assert [r.delivery for r in receiver.got()] == [str(ping["id"])]  # once
    assert done["id"] == ping["id"] and done["attempts"] >= 2 and done["last_status_code"] == 200
    assert done["last_error"].startswith("attempt ") and "ConnectError" in done["last_error"]


def test_a_receiver_that_never_answers_holds_up_nothing_else(
    stack: Stack, hooks: list[dict[str, Any]]
) -> None:
    with receiving(Receiver(hang=True)) as stuck, receiving() as healthy:
        held = add_hook(stack, hooks, stuck.url, events=["job.succeeded"])
        add_hook(stack, hooks, healthy.url, events=["job.succeeded"])
        job = stack.submit(**TINY, name="told twice")
        wait_for(lambda: stuck.hanging, 60, "the hanging receiver to hold its request")
        got = wait_for(lambda: healthy.got(), 30, "the healthy receiver's delivery")
        assert [r.json["job"]["id"] for r in got] == [job["id"]]
        # The stuck attempt is still in flight (claimed, no attempt recorded) while the
        # other webhook's delivery of the same event went through, and submits go on.
        [in_flight] = deliveries(stack, held)
        assert in_flight["state"] == "pending" and in_flight["attempts"] == 0
        more = [stack.submit(**TINY, name=f"while it hangs {i}") for i in range(3)]
        assert len({j["id"] for j in more}) == 3
        assert stuck.hanging >= 1 and not stuck.released.is_set()
        assert deliveries(stack, held)[-1]["attempts"] == 0
        # ended here, not during a test after this one (where its webhooks would hear them)
        for extra in more:
            stack.http.post(f"/jobs/{extra['id']}/cancel")
        for extra in more:
            stack.wait_status(extra["id"], {"succeeded", "failed", "cancelled"}, 60)
