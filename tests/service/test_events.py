"""Event numbering, paged reads of the event stream, and the per-job log bound."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import Engine

from service import events, store
from service.events import read_events
from service.models import JobCreate, JobStatus
from service.points import MetricPoint
from service.reasons import ReasonCode as R
from service.store import Fence, Outcome
from tests.service.test_store import CLAIM, at_step


def _running_job(engine: Engine) -> Fence:
    store.create_job(engine, JobCreate(recipe="r"))
    job = store.claim_job(engine, **CLAIM)
    assert job is not None
    return job.fence


def test_paged_reads_from_any_point_see_each_event_once_in_order(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(events, "PAGE", 4)  # many pages, ending on either kind
    fence = _running_job(engine)
    for step in range(1, 12):
        point = MetricPoint(name="train/loss", step=step, epoch=1, value=1 / step, time=0.0)
        assert store.report(engine, fence, progress=at_step(step), metrics=[point])
        lines = [(0.0, "stdout", f"step {step} line {i}") for i in range(step % 3)]
        assert store.append_logs(engine, fence, lines, max_lines=1000)
    done = Outcome(JobStatus.succeeded, R.succeeded, "finished")
    assert store.finish_attempt(engine, fence, done) is not None

    def drain(after: int) -> list[events.Event]:
        got: list[events.Event] = []
        while True:
            batch = read_events(engine, fence.job_id, after)
            got += batch.events
            assert batch.position >= after
            after = batch.position
            if batch.ended:
                return got

    everything = drain(0)
    ids = [e.id for e in everything]
    assert ids == sorted(set(ids))
    history = [e for e in everything if e.kind in ("metric", "log")]
    assert [e.data["step"] for e in history if e.kind == "metric"] == list(range(1, 12))
    assert sum(e.kind == "log" for e in history) == sum(s % 3 for s in range(1, 12))
    assert everything[-1].kind == "status" and everything[-1].data["status"] == "succeeded"
    # only the latest progress is state worth sending
    assert [e.data for e in everything if e.kind == "progress"] == [at_step(11).as_dict()]
    for cut in range(len(everything)):  # resuming after any event gives exactly the rest
        rest = drain(everything[cut].id)
        assert [e.id for e in rest] == ids[cut + 1 :]


def test_log_bound_keeps_the_head_and_the_newest_lines_with_a_marker(engine: Engine) -> None:
    fence = _running_job(engine)
    printed = [f"line {i}" for i in range(1, 251)]
    for start in range(0, 250, 7):
        batch = [(0.0, "stdout", text) for text in printed[start : start + 7]]
        assert store.append_logs(engine, fence, batch, max_lines=100)
    batch = read_events(engine, fence.job_id, 0)
    kept = [e.data["text"] for e in batch.events if e.kind == "log"]
    assert len(kept) == 100
    assert kept[:50] == printed[:50]  # how the job started
    assert kept[51:] == printed[-49:]  # and the last lines before it ended
    assert kept[50].startswith("[trainyard] 151 line(s) dropped here")
    job = store.load_job(engine, fence.job_id)
    assert (job.log_count, job.log_dropped) == (100, 151)


def test_an_idle_stream_gets_keep_alives_and_new_events_live(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(events, "KEEPALIVE_S", 0.3)
    fence = _running_job(engine)

    async def follow() -> list[list[str]]:
        feeds = events.JobFeeds(engine, poll_s=0.05)
        seen: list[list[str]] = []
        async for batch in feeds.watch(fence.job_id, 0):
            seen.append([e.kind for e in batch])
            if len(seen) == 2:  # history, then a keep-alive: now something happens
                line = [(0.0, "stdout", "live")]
                await asyncio.to_thread(store.append_logs, engine, fence, line, max_lines=100)
            if len(seen) == 3:
                done = Outcome(JobStatus.succeeded, R.succeeded, "finished")
                await asyncio.to_thread(store.finish_attempt, engine, fence, done)
        return seen

    seen = asyncio.run(asyncio.wait_for(follow(), 10))
    assert seen[0] == ["status"] and seen[1] == []  # the claim; then only a keep-alive
    assert seen[2] == ["log"] and seen[-1] == ["status"]  # live, then the end
    assert all(kind != [] for kind in seen[2:])
    frame = events.Event(7, "log", {"text": "x"}).frame  # encoded once, for every watcher
    assert frame == b'event: log\ndata: {"text":"x"}\nid: 7\n\n'
