"""The databases the suite runs on: a SQLite file per test, and one throwaway PostgreSQL
database per test run (emptied between tests) on the server in TRAINYARD_TEST_POSTGRES."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, event, insert, text
from sqlalchemy.engine import make_url

from service import store
from service.migrate import upgrade
from service.models import BOOTSTRAP_USER, NO_USAGE, User

# The server, by a database on it that we may connect to in order to create our own.
ADMIN_URL = os.environ.get(
    "TRAINYARD_TEST_POSTGRES", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)
# CI sets this: there a missing server is a failure, not a reason to skip.
REQUIRED = os.environ.get("TRAINYARD_TEST_REQUIRE_POSTGRES") == "1"
TABLES = (
    "sweep_trial", "sweep", "job_node", "job_blob", "blob_upload", "blob", "log_line", "metric",
    "webhook_delivery", "webhook", "job", "worker",
    "api_token", "audit_event", "trainyard_user",
)  # fmt: skip


@contextmanager
def throwaway_postgres(*, migrate: bool = True) -> Iterator[str]:
    """A new database on the server (migrated to the newest schema unless told not to);
    dropped afterwards."""
    admin = create_engine(ADMIN_URL, isolation_level="AUTOCOMMIT")
    name = f"trainyard_test_{os.getpid()}_{secrets.token_hex(3)}"
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    except Exception as exc:
        admin.dispose()
        message = f"PostgreSQL at {make_url(ADMIN_URL).render_as_string()} unavailable: {exc}"
        if REQUIRED:
            raise RuntimeError(message) from exc
        pytest.skip(message)
    url = make_url(ADMIN_URL).set(database=name).render_as_string(hide_password=False)
    try:
        if migrate:
            upgrade(url)
        yield url
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def empty(url: str) -> None:
    """Delete every row (and restart the ids) between tests."""
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {', '.join(TABLES)} RESTART IDENTITY CASCADE"))
        # as migration 0010 left it: the bootstrap admin, with no usage yet
        conn.execute(insert(User).values(name=BOOTSTRAP_USER, admin=True, usage_score=NO_USAGE))
    engine.dispose()


def claim_as_sent(engine: Engine, **claim: Any) -> tuple[store.Claim | None, str, Any]:
    """``store.claim_job(engine, **claim)``, with the claim statement and its parameters
    exactly as it handed them to the driver (to EXPLAIN it, or to replay it bare)."""
    sent: list[tuple[str, Any]] = []

    def keep(_c: Any, _cur: Any, statement: str, params: Any, _ctx: Any, _many: bool) -> None:
        if statement.startswith(("UPDATE job", "WITH reserved_job")):  # the claim's CTE
            sent.append((statement, params))

    event.listen(engine, "before_cursor_execute", keep)
    try:
        claimed = store.claim_job(engine, **claim)
    finally:
        event.remove(engine, "before_cursor_execute", keep)
    [(statement, params)] = sent
    return claimed, statement, params
