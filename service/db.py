"""Engine and sessions, built from settings; SQLite tuned so no writer ever sees 'locked'."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from weakref import WeakKeyDictionary

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, InterfaceError, InternalError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlmodel import Session

from service.settings import Settings

# Seconds a SQLite writer waits for the lock before giving up. Far above any transaction
# we run (all are short), so "database is locked" means a bug, not load.
SQLITE_BUSY_TIMEOUT_S = 30.0
# PostgreSQL: a session idle inside a transaction this long is ended by the server.
IDLE_IN_TRANSACTION_MS = 5_000
# PostgreSQL: notice a dead peer (a partition, a crashed host) within seconds, not after
# the kernel's retransmission timeout of about 15 minutes.
TCP_KEEPALIVE = {
    "keepalives": 1,
    "keepalives_idle": 5,
    "keepalives_interval": 2,
    "keepalives_count": 3,
    "tcp_user_timeout": 10_000,
}


def make_engine(settings_or_url: Settings | str) -> Engine:
    """Create the engine for a database URL (SQLite gets WAL, busy timeout, explicit BEGIN)."""
    url = settings_or_url if isinstance(settings_or_url, str) else settings_or_url.database_url
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        # A process stopped (or hung) inside a transaction would hold its row locks for as
        # long as it is stopped; the server ends such a session after a few seconds instead
        # (every transaction here lasts milliseconds). Pre-ping replaces connections a
        # database restart broke, so the API and workers recover by themselves.
        options = f"-c idle_in_transaction_session_timeout={IDLE_IN_TRANSACTION_MS}"
        return create_engine(
            url,
            pool_pre_ping=True,
            pool_size=10,
            max_overflow=20,
            connect_args={"options": options, "connect_timeout": 5, **TCP_KEEPALIVE},
        )

    pool: dict[str, Any] = {}
    if parsed.database and parsed.database != ":memory:":
        Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        # as many connections as the API's thread pool has threads: SQLite's are cheap
        pool = {"pool_size": 40, "max_overflow": 10}
    engine = create_engine(
        url, connect_args={"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_S}, **pool
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Let SQLAlchemy's "begin" event emit BEGIN itself, so writers can ask for
        # BEGIN IMMEDIATE: a deferred read-then-write transaction can fail with
        # SQLITE_BUSY without waiting when another writer got there first.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")  # durable in WAL, far fewer fsyncs
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute(f"PRAGMA busy_timeout={int(SQLITE_BUSY_TIMEOUT_S * 1000)}")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        mode = conn.get_execution_options().get("sqlite_begin", "DEFERRED")
        conn.exec_driver_sql(f"BEGIN {mode}")

    return engine


# The errors that mean "the database is not there now": the API answers them 503 with
# Retry-After, and a write that failed with one is not the row's fault. OperationalError:
# cannot connect, connection lost; InterfaceError: connection already closed;
# InternalError: e.g. the server ended an idle-in-transaction session; PoolTimeout: no
# pooled connection came free in time.
DATABASE_UNAVAILABLE = (OperationalError, InterfaceError, InternalError, PoolTimeout)


def unavailable(exc: BaseException) -> bool:
    """Whether a failed write failed for want of the database (down, unreachable, the
    connection lost or none free), not because it refused what was written: retrying
    the rows one by one then would only fail the same way, one wait after another."""
    return isinstance(exc, DATABASE_UNAVAILABLE) or (
        isinstance(exc, DBAPIError) and exc.connection_invalidated
    )


def is_sqlite(engine: Engine) -> bool:
    """Whether the engine talks to SQLite (claims and upserts differ by dialect)."""
    return engine.dialect.name == "sqlite"


# One SQLite writer at a time per process, queued on a mutex. Without it, threads of one
# process contend through SQLite's busy handler, which sleeps 1, 2, 5 ... 100 ms between
# tries: under load that sleeping, not the work, sets the latency.
_sqlite_writers: WeakKeyDictionary[Engine, tuple[threading.Lock, Engine]] = WeakKeyDictionary()
_sqlite_writers_guard = threading.Lock()


def _sqlite_writer(engine: Engine) -> tuple[threading.Lock, Engine]:
    """This process's write mutex for the database, and the engine that begins IMMEDIATE."""
    with _sqlite_writers_guard:
        if engine not in _sqlite_writers:
            immediate = engine.execution_options(sqlite_begin="IMMEDIATE")
            _sqlite_writers[engine] = (threading.Lock(), immediate)
        return _sqlite_writers[engine]


@contextmanager
def write_session(engine: Engine) -> Iterator[Session]:
    """A session whose transaction takes the write lock up front, committed on exit."""
    if not is_sqlite(engine):
        with Session(engine, expire_on_commit=False) as session:
            yield session
            session.commit()
        return
    lock, immediate = _sqlite_writer(engine)
    with lock, Session(immediate, expire_on_commit=False) as session:
        yield session
        session.commit()


@contextmanager
def statement_connection(engine: Engine) -> Iterator[Connection]:
    """A Core connection for one write statement, which is its own transaction (the claim).

    PostgreSQL runs it in autocommit: one round trip, where a transaction around it takes
    three (BEGIN, the statement, COMMIT). SQLite takes the write lock as ``write_session``.
    """
    if not is_sqlite(engine):
        with engine.connect() as conn:
            yield conn.execution_options(isolation_level="AUTOCOMMIT")
        return
    lock, immediate = _sqlite_writer(engine)
    with lock, immediate.begin() as conn:
        yield conn


@contextmanager
def read_session(engine: Engine) -> Iterator[Session]:
    """A session for reads only."""
    with Session(engine, expire_on_commit=False) as session:
        yield session
