"""The event stream of a real job on a real server: live, resumable, complete."""

from __future__ import annotations

import pytest

from tests.stack import Stack

pytestmark = pytest.mark.slow

TERMINAL = {"succeeded", "failed", "cancelled"}


def test_stream_resumes_after_a_disconnect_with_no_gap_and_no_duplicate(stack: Stack) -> None:
    stack.start_worker()
    job = stack.submit(
        recipe="tiny",
        epochs=3,
        batch_size=8,
        params={"samples": 96, "sleep_per_step_s": 0.02, "chatty": 1},
    )
    # Watch live, then drop the connection mid-run, as a laptop going to sleep would.
    first = stack.events(job["id"], limit=25)
    assert len(first) == 25 and first[0][1] == "status"
    last_id = first[-1][0]
    assert last_id is not None
    rest = stack.events(job["id"], last_event_id=last_id)
    assert rest[-1][1] == "end"
    final_status = rest[-2]
    assert final_status[1] == "status" and final_status[2]["status"] == "succeeded"
    assert rest[0][0] is not None and rest[0][0] > last_id, "resumed after the last id seen"
    seen = first + rest[:-1]

    ids = [event_id for event_id, _, _ in seen]
    assert ids == sorted(ids) and len(set(ids)) == len(ids), "increasing, no duplicate"

    # Logs and metric points are history: the two parts together equal a full replay.
    replay = stack.events(job["id"])
    assert replay[-1][1] == "end"

    def history(events: list[tuple[int | None, str, object]]) -> list[tuple[object, ...]]:
        return [e for e in events if e[1] in ("log", "metric")]

    assert history(seen) == history(replay)
    logs = [data for _, kind, data in seen if kind == "log"]
    stored = stack.http.get(f"/jobs/{job['id']}/logs", params={"limit": 10_000}).json()
    assert logs == stored and any("step line 0" in line["text"] for line in logs)
    metrics = [data for _, kind, data in seen if kind == "metric"]
    assert len(metrics) == len(stack.http.get(f"/jobs/{job['id']}/metrics").json())
    assert [m["epoch"] for m in metrics if m["name"] == "val/loss"] == [1, 2, 3]
    statuses = [data["status"] for _, kind, data in seen if kind == "status"]
    assert statuses[0] in {"queued", "running"} and statuses[-1] == "succeeded"
    assert any(kind == "progress" for _, kind, _ in seen)


def test_a_finished_job_streams_its_history_and_ends(stack: Stack) -> None:
    stack.start_worker()
    job = stack.submit(recipe="tiny", params={"fail": True}, max_attempts=1)
    stack.wait_status(job["id"], TERMINAL)
    events = stack.events(job["id"])
    kinds = [kind for _, kind, _ in events]
    assert kinds[-2:] == ["status", "end"] and events[-2][2]["status"] == "failed"
    texts = [data["text"] for _, kind, data in events if kind == "log"]
    assert any("last words on stderr" in t for t in texts)
    # nothing after the end: a client resuming from the last id gets the end at once
    assert stack.events(job["id"], last_event_id=events[-2][0]) == [(None, "end", events[-1][2])]
    r = stack.http.get("/jobs/999999/events")
    assert r.status_code == 404
