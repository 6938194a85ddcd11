"""Preemption end to end: a job that outranks a running DDP job and has
waited past PREEMPT_AFTER_S stops it; the victim checkpoints where it is, goes back to
the queue without spending an attempt, says who preempted it, and later resumes to the
weights of an uninterrupted run. A real server and worker, on both databases."""

from __future__ import annotations

import pytest

from tests.e2e.test_chaos import (
    SLOW,
    SLOW_PARAMS,
    assert_same_weights,
    job_weights,
    reference_weights,
)
from tests.stack import Stack, wait_for

pytestmark = pytest.mark.slow


def test_a_preempted_ddp_job_resumes_to_the_weights_of_an_uninterrupted_run(
    stack: Stack,
) -> None:
    stack.start_worker(preempt_after_s=1, preempt_cooldown_s=3600)
    # ~1.6 s an epoch: long enough to be stopped midway (the worker weighs the queue
    # every 5 s)
    victim = stack.submit(**SLOW, epochs=12, params={**SLOW_PARAMS, "sleep_per_step_s": 0.1})
    wait_for(
        lambda: (stack.job(victim["id"])["progress"] or {}).get("epoch", 0) >= 3, 60, "epoch 3"
    )
    # Its owner's own job, of a higher priority, on the same two slots.
    urgent = stack.submit(**SLOW, epochs=1, priority=5, params={"samples": 64})

    def handed_back() -> dict[str, object] | None:
        job = stack.job(victim["id"])
        return job if job["status"] == "queued" else None

    back = wait_for(handed_back, 60, "the running job to be preempted")
    assert back["attempt"] == 1  # no attempt spent
    assert back["reason"]["code"] == "preempted", back["reason"]  # type: ignore[index]
    who = f"preempted by job {urgent['id']} (admin's, priority 5)"
    assert back["reason"]["message"].startswith(who), back["reason"]  # type: ignore[index]
    assert stack.wait_status(urgent["id"], {"succeeded", "failed"})["status"] == "succeeded"
    done = stack.wait_status(victim["id"], {"succeeded", "failed"})
    assert done["status"] == "succeeded" and done["attempt"] == 1, done
    texts = [x["text"] for x in stack.http.get(f"/jobs/{victim['id']}/logs").json()]
    assert any("resuming from epoch-" in t for t in texts)
    val = stack.http.get(f"/jobs/{victim['id']}/metrics", params={"name": "val/loss"}).json()
    assert [m["epoch"] for m in val] == list(range(1, 13))  # each epoch once
    assert_same_weights(job_weights(stack, victim["id"]), reference_weights(stack, victim["id"]))
    events = stack.http.get("/audit", params={"limit": 500}).json()["items"]
    [event] = [e for e in events if e["action"] == "preempted"]
    assert (event["actor"], event["target"]) == ("admin", f"job {victim['id']}")
    assert event["detail"] == {"by_job": urgent["id"]}
