"""Group commit for submits: many request threads, one writer, one transaction a batch.

Under load a submit's cost is mostly the transaction around its one INSERT: the write
lock (SQLite) or the WAL flush (PostgreSQL), and, with many threads, the GIL handing
the lock holder's time to the threads queued behind it. Here requests hand their row to one
writer thread and wait for its future (the API awaits it on the event loop, holding no
thread); the writer takes whatever has queued up meanwhile (one row when idle, dozens
under load) and inserts it all in one transaction. Nothing waits on a timer: an idle
submit is written at once.

A row the database refuses (one that got past validation) fails its own request only:
a batch that fails is written again row by row. ``write`` may also refuse a row itself
(an owner's limit, counted in the batch's transaction): it returns the exception in that
row's place, the caller gets it, and the batch's other rows are committed.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any
from weakref import WeakKeyDictionary

from sqlalchemy import Engine
from sqlmodel import Session

from service.db import unavailable, write_session

log = logging.getLogger(__name__)
MAX_BATCH = 256

Values = dict[str, Any]  # one row to insert
# Writes the batch's items in the session; one result per item, an exception to raise to
# that item's caller in place of a refused item's result.
Write = Callable[[Session, list[Any]], list[Any]]


class GroupCommit:
    """One writer thread for one engine; ``submit`` blocks until its row is committed."""

    def __init__(self, engine: Engine, write: Write) -> None:
        self.engine = engine
        self.write = write
        self.pending: queue.SimpleQueue[tuple[Any, Future[Any]]] = queue.SimpleQueue()
        threading.Thread(target=self._run, name="group-commit", daemon=True).start()

    def submit(self, row: Any) -> Any:
        return self.enqueue(row).result()

    def enqueue(self, row: Any) -> Future[Any]:
        """The row's future: an event loop awaits it (``asyncio.wrap_future``) and holds no
        thread while the row waits for its batch."""
        done: Future[Any] = Future()
        self.pending.put((row, done))
        return done

    def _run(self) -> None:
        while True:
            batch: list[tuple[Any, Future[Any]]] = []
            while len(batch) < MAX_BATCH:
                try:
                    row, done = self.pending.get(block=not batch)
                except queue.Empty:
                    break
                # A request cancelled before its batch began (its client went away) is
                # dropped; once taken, cancel() fails and the caller learns the outcome.
                if done.set_running_or_notify_cancel():
                    batch.append((row, done))
            try:
                self._commit(batch)
            except BaseException as exc:
                if len(batch) == 1 or unavailable(exc):  # every caller learns why
                    for _, done in batch:
                        done.set_exception(exc)
                    continue
                # The database refused the batch: perhaps one row of it. Each row again
                # in a transaction of its own, so only a bad row's request fails.
                log.warning(
                    "a batch of %d submits failed (%s); writing them one by one",
                    len(batch),
                    exc.__class__.__name__,
                )
                for one in batch:
                    try:
                        self._commit([one])
                    except BaseException as row_exc:
                        one[1].set_exception(row_exc)

    def _commit(self, batch: list[tuple[Any, Future[Any]]]) -> None:
        """Write the batch's rows in one transaction, then answer each row's future."""
        with write_session(self.engine) as session:
            results = self.write(session, [row for row, _ in batch])
        for (_, done), result in zip(batch, results, strict=True):
            if isinstance(result, Exception):
                done.set_exception(result)
            else:
                done.set_result(result)


_committers: WeakKeyDictionary[Engine, GroupCommit] = WeakKeyDictionary()
_committers_guard = threading.Lock()


def committer(engine: Engine, write: Write) -> GroupCommit:
    """The engine's group committer (one per process and engine)."""
    with _committers_guard:
        if engine not in _committers:
            _committers[engine] = GroupCommit(engine, write)
        return _committers[engine]
