"""A job's event stream: status changes, progress, metric points and log lines, in order.

Everything a watcher can see of a job carries a number from the job's own counter
(``Job.event_seq``), taken under the job row's lock in the transaction that writes it, so
numbers are committed in order. A reader that first reads the counter (``upto``) and then
the rows numbered up to it sees every one of them: resuming after a number gives no gap
and no duplicate. Status and progress are state, kept on the job row: a watcher gets their
latest value when it changed after its number.

One ``_Feed`` per watched job and API process polls the database and fans events out to
all of that job's watchers, so a hundred watchers cost one poll, not a hundred. Each
stream holds a connection and a task as long as its job runs: ``StreamSlots`` caps how
many an API process serves, per user and in all.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import anyio
from anyio import to_thread
from fastapi.sse import EventSourceResponse, format_sse_event
from sqlalchemy import Engine, RowMapping, Table, select
from sqlmodel import Session
from starlette.types import Receive, Scope, Send

from service.db import read_session
from service.errors import JobNotFound
from service.models import Job, JobRead, JobStatus, LogLine, LogLineRead, Metric, MetricRead
from service.points import finite_json

log = logging.getLogger(__name__)
TERMINAL = frozenset({JobStatus.succeeded, JobStatus.failed, JobStatus.cancelled})
PAGE = 2_000  # rows of each kind per read: a long job's history streams in pieces
POLL_S = 0.2  # a feed's database poll while someone watches
KEEPALIVE_S = 15.0  # an idle stream sends a comment this often, so proxies keep it open
BUFFER = 20_000  # recent events a feed keeps for watchers that are a little behind


@dataclass(frozen=True)
class Event:
    id: int
    kind: str  # status, progress, metric or log
    data: dict[str, Any]

    @cached_property
    def frame(self) -> bytes:
        """The event on the wire, encoded once however many watchers it is sent to."""
        try:  # strict: a NaN would reach browsers as `NaN`, which no JSON parser takes
            data = json.dumps(self.data, separators=(",", ":"), allow_nan=False)
        except ValueError:  # stored before numbers were made finite where they are made
            data = json.dumps(finite_json(self.data), separators=(",", ":"), allow_nan=False)
        return format_sse_event(data_str=data, event=self.kind, id=str(self.id))


@dataclass(frozen=True)
class Batch:
    events: list[Event]
    position: int  # the number the batch reaches: resume after it
    ended: bool  # the job finished and nothing after ``position`` will come
    more: bool = False  # a page was full: more is there to read at once


def read_events(engine: Engine, job_id: int, after: int | None) -> Batch:
    """Events of a job numbered after ``after`` (None: none, just the current position)."""
    with read_session(engine) as session:
        job = session.get(Job, job_id)
        if job is None:
            raise JobNotFound(job_id)
        upto = job.event_seq
        if after is None or upto <= after:
            return Batch([], upto, job.status in TERMINAL)
        last = upto
        metrics = _page(session, _METRIC, _METRIC_FIELDS, job_id, after, upto)
        logs = _page(session, _LOG, _LOG_FIELDS, job_id, after, upto)
    # A full page may stop short of upto: end this batch where the shorter page ends.
    for page in (metrics, logs):
        if len(page) == PAGE:
            upto = min(upto, page[-1]["seq"])
    events = [Event(m["seq"], "metric", _without_seq(m)) for m in metrics if m["seq"] <= upto]
    events += [Event(line["seq"], "log", dict(line)) for line in logs if line["seq"] <= upto]
    if after < job.progress_seq <= upto and job.progress is not None:
        events.append(Event(job.progress_seq, "progress", job.progress))
    if after < job.status_seq <= upto:
        events.append(
            Event(job.status_seq, "status", JobRead.from_row(job).model_dump(mode="json"))
        )
    events.sort(key=lambda e: e.id)
    return Batch(events, upto, job.status in TERMINAL and upto == last, more=upto < last)


_METRIC = Metric.__table__  # type: ignore[attr-defined]
_LOG = LogLine.__table__  # type: ignore[attr-defined]
_METRIC_FIELDS = ["seq", *MetricRead.model_fields]
_LOG_FIELDS = list(LogLineRead.model_fields)


def _page(
    session: Session, table: Table, fields: list[str], job_id: int, after: int, upto: int
) -> list[RowMapping]:
    """The first PAGE rows of a job numbered in (after, upto], in order."""
    seq = table.c.seq
    query = (
        select(*(table.c[f] for f in fields))
        .where(table.c.job_id == job_id, seq > after, seq <= upto)
        .order_by(seq)
        .limit(PAGE)
    )
    return list(session.execute(query).mappings())


def _without_seq(row: RowMapping) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k != "seq"}


class _Feed:
    """The recent events of one job, polled from the database while anyone watches."""

    def __init__(self, feeds: JobFeeds, job_id: int, start: Batch) -> None:
        self.feeds = feeds
        self.job_id = job_id
        self.start = start.position  # the buffer holds events numbered after this
        self.position = start.position
        self.ended = start.ended
        self.recent: deque[Event] = deque()
        self.watchers = 0
        # Set, and replaced by a new one, whenever the feed moves: a watcher waits on the
        # one it saw. (An event, not a Condition: a watcher cancelled while it waits has
        # no lock to take back, which under Python 3.11's wait_for could be left held.)
        self.changed = asyncio.Event()
        self.task = asyncio.create_task(self._poll())

    def after(self, cursor: int) -> list[Event] | None:
        """Buffered events after ``cursor``; None when the buffer no longer reaches back."""
        if cursor < self.start:
            return None
        newer = []  # from the newest back: O(new events), not O(buffer), per watcher
        for event in reversed(self.recent):
            if event.id <= cursor:
                break
            newer.append(event)
        newer.reverse()
        return newer

    async def _poll(self) -> None:
        try:
            while self.watchers and not self.ended:
                batch = await to_thread.run_sync(
                    read_events, self.feeds.engine, self.job_id, self.position
                )
                self.recent.extend(batch.events)
                while len(self.recent) > BUFFER:
                    self.start = self.recent.popleft().id
                self.position, self.ended = batch.position, batch.ended
                if batch.events or batch.ended:
                    self._announce()
                if not batch.more:  # a busy job would otherwise be polled back to back
                    await asyncio.sleep(self.feeds.poll_s)
        except Exception as exc:  # the database went away: watchers read on their own
            log.warning("event feed of job %s stopped: %s", self.job_id, exc)
        finally:
            self.feeds.close(self)
            self._announce()  # watchers then read on their own

    def _announce(self) -> None:
        changed, self.changed = self.changed, asyncio.Event()
        changed.set()

    async def wait(self, cursor: int, timeout: float) -> None:
        """Until the feed passes ``cursor`` or ``timeout`` (a poll interval, once the feed
        stopped)."""
        if self.task.done():
            await asyncio.sleep(min(timeout, self.feeds.poll_s))
            return
        changed = self.changed
        if self.position <= cursor and not self.ended:
            with anyio.move_on_after(timeout):
                await changed.wait()


class StreamSlots:
    """The event streams one API process has open, per user and in all."""

    def __init__(self) -> None:
        self.by_user: Counter[str] = Counter()
        self.total = 0

    def take(self, user: str, *, per_user: int, in_all: int) -> str | None:
        """Count a new stream of ``user``'s; or, past a cap, why not (nothing counted)."""
        if self.by_user[user] >= per_user:
            return (
                f"{user} has {self.by_user[user]} event streams open, the most allowed "
                f"({per_user}, TRAINYARD_MAX_EVENT_STREAMS_PER_USER): close one, or poll "
                "GET /api/v1/jobs/{id}"
            )
        if self.total >= in_all:
            return (
                f"this server has {self.total} event streams open, the most allowed "
                f"({in_all}, TRAINYARD_MAX_EVENT_STREAMS): try again later"
            )
        self.by_user[user] += 1
        self.total += 1
        return None

    def give_back(self, user: str) -> None:
        """A stream of ``user``'s has ended."""
        self.by_user[user] -= 1
        if self.by_user[user] <= 0:
            del self.by_user[user]
        self.total -= 1


class HeldStream(EventSourceResponse):
    """An event stream that gives its slot back however it ends: finished, the client
    gone, or never started (a generator's ``finally`` runs only once it has started)."""

    def __init__(self, content: Any, release: Callable[[], None], **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self.release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.release()


class JobFeeds:
    """The feeds of one API process, by job, and its open streams."""

    def __init__(self, engine: Engine, poll_s: float = POLL_S) -> None:
        self.engine = engine
        self.poll_s = poll_s
        self.feeds: dict[int, _Feed] = {}
        self.slots = StreamSlots()

    def close(self, feed: _Feed) -> None:
        if self.feeds.get(feed.job_id) is feed:
            del self.feeds[feed.job_id]

    async def _join(self, job_id: int) -> _Feed:
        """The job's running feed, or a new one; counted as watched by the caller."""
        feed = self.feeds.get(job_id)
        if feed is None:
            start = await to_thread.run_sync(read_events, self.engine, job_id, None)
            feed = self.feeds.get(job_id)  # another watcher may have made one meanwhile
            if feed is None:
                feed = self.feeds[job_id] = _Feed(self, job_id, start)
        feed.watchers += 1
        return feed

    async def watch(self, job_id: int, after: int) -> AsyncIterator[list[Event]]:
        """Every event of the job after ``after``, live, in batches (an empty one after
        KEEPALIVE_S without any), until the job has finished."""
        feed = await self._join(job_id)
        try:
            cursor = after
            quiet_since = time.monotonic()
            while True:
                if feed.task.done() and not feed.ended:  # it stopped on a database error
                    stopped, feed = feed, await self._join(job_id)
                    stopped.watchers -= 1
                position, ended = feed.position, feed.ended
                events = feed.after(cursor)
                if events is None:  # behind the feed's buffer: catch up from the database
                    batch = await to_thread.run_sync(read_events, self.engine, job_id, cursor)
                    events, position, ended = batch.events, batch.position, batch.ended
                if events:
                    yield events
                    quiet_since = time.monotonic()
                elif time.monotonic() - quiet_since >= KEEPALIVE_S:
                    yield []
                    quiet_since = time.monotonic()
                cursor = max(cursor, position)
                if ended:
                    return
                if not events:
                    await feed.wait(cursor, KEEPALIVE_S - (time.monotonic() - quiet_since))
        finally:
            feed.watchers -= 1
