"""Wake idle workers the moment a job becomes claimable.

On PostgreSQL every change that makes a job claimable (a submit, a retry, a job handed
back) sends ``NOTIFY trainyard_jobs`` in its own transaction, so the notification goes out
when, and only if, the change commits. Workers LISTEN on a connection of their own and
claim at once; their poll stays only as a fallback. SQLite has no such channel: there
workers poll (an idle poll is one indexed read).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo
from sqlalchemy import Connection, Engine, text
from sqlmodel import Session

from service.db import TCP_KEEPALIVE

log = logging.getLogger(__name__)

CHANNEL = "trainyard_jobs"
_NOTIFY = text(f"SELECT pg_notify('{CHANNEL}', '')")
RECONNECT_S = 1.0


def can_listen(engine: Engine | Connection) -> bool:
    """Whether the database has LISTEN/NOTIFY (PostgreSQL)."""
    return engine.dialect.name == "postgresql"


def announce_job(session: Session) -> None:
    """Tell listening workers, when this transaction commits, that a job can be claimed."""
    if can_listen(session.get_bind()):
        session.execute(_NOTIFY)


class JobListener(threading.Thread):
    """LISTENs on PostgreSQL and calls ``wake`` for every notification (and after each
    (re)connect, for what it may have missed meanwhile)."""

    def __init__(self, engine: Engine, wake: Callable[[], None]) -> None:
        super().__init__(name="job-listener", daemon=True)
        url = engine.url
        params: dict[str, Any] = {**url.query, **TCP_KEEPALIVE}
        params |= url.translate_connect_args(username="user", database="dbname")
        self.conninfo = make_conninfo(**params)  # quotes what needs quoting (spaces too)
        self.wake = wake
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.is_set():
            try:
                with psycopg.connect(self.conninfo, autocommit=True, connect_timeout=5) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    self.wake()
                    while not self.stopped.is_set():
                        for _ in conn.notifies(timeout=1.0):
                            self.wake()
            except psycopg.Error as exc:
                log.warning("LISTEN %s: %s; polling until it reconnects", CHANNEL, exc)
                self.stopped.wait(RECONNECT_S)

    def stop(self) -> None:
        self.stopped.set()
