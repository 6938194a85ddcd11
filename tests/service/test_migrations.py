"""The Alembic migrations produce exactly the models' schema."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Engine, inspect
from sqlmodel import SQLModel

import service.models  # noqa: F401  (tables on the metadata)


def test_migrations_match_models(engine: Engine) -> None:
    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        assert compare_metadata(context, SQLModel.metadata) == []


def test_migrated_sqlite_is_in_wal_mode(engine: Engine) -> None:
    with engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() >= 10_000
    assert {"job", "metric", "log_line", "worker", "alembic_version"} <= set(
        inspect(engine).get_table_names()
    )
