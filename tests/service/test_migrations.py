"""The Alembic migrations produce exactly the models' schema."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Engine, create_engine, inspect
from sqlmodel import SQLModel

import service.models  # noqa: F401  (tables on the metadata)
from service.db import make_engine
from service.events import read_events
from service.migrate import alembic_config, upgrade
from tests.databases import throwaway_postgres


def test_migrations_match_models(engine: Engine) -> None:
    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        assert compare_metadata(context, SQLModel.metadata) == []


def test_migrated_sqlite_is_in_wal_mode(engine: Engine) -> None:
    if engine.dialect.name != "sqlite":
        pytest.skip("a SQLite setting")
    with engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() >= 10_000
    assert {"job", "metric", "log_line", "worker", "alembic_version"} <= set(
        inspect(engine).get_table_names()
    )


@pytest.fixture(params=["sqlite", "postgresql"])
def unmigrated_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty database of each kind, no schema yet."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'old.db'}"
        return
    with throwaway_postgres(migrate=False) as url:
        yield url


def test_event_numbers_are_given_to_rows_made_before_they_existed(unmigrated_url: str) -> None:
    """0004 numbers a job's existing logs and metric points so a replay keeps them all."""
    url = unmigrated_url
    command.upgrade(alembic_config(url), "0003")
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "INSERT INTO job (id, recipe, params, strategy, devices, accelerator, epochs, "
            "batch_size, lr, optimizer, seed, precision, priority, max_attempts, "
            "checkpoint_every, status, attempt, created_at) VALUES (1, 'r', '{}', 'single', 1, "
            "'cpu', 1, 8, 0.001, 'adamw', 0, 'fp32', 0, 3, 1, 'succeeded', 1, '2026-01-01')"
        )
        for seq in (1, 2, 3):
            conn.exec_driver_sql(
                f"INSERT INTO log_line VALUES (1, {seq}, 0.0, 'stdout', 'line {seq}')"
            )
        for step in (10, 20):
            conn.exec_driver_sql(f"INSERT INTO metric VALUES (1, 'val/loss', {step}, 1, 0.5, 0.0)")
            conn.exec_driver_sql(
                f"INSERT INTO metric VALUES (1, 'train/loss', {step}, 1, 0.5, 0.0)"
            )
    engine.dispose()
    upgrade(url)
    engine = make_engine(url)
    batch = read_events(engine, 1, 0)
    assert batch.ended
    assert [(e.id, e.kind) for e in batch.events] == [
        (1, "log"),
        (2, "log"),
        (3, "log"),
        (4, "metric"),
        (5, "metric"),
        (6, "metric"),
        (7, "metric"),
        (8, "status"),
    ]
    assert [e.data["name"] for e in batch.events if e.kind == "metric"] == [
        "train/loss",
        "val/loss",
        "train/loss",
        "val/loss",
    ]
    engine.dispose()


def _index_definitions(engine: Engine) -> dict[str, str]:
    """Every index as the database itself spells it (column order, DESC and all)."""
    with engine.connect() as conn:
        if engine.dialect.name == "sqlite":
            query = "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL"
        else:
            query = "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'public'"
        rows = conn.exec_driver_sql(query)
        return {name: " ".join(sql.split()) for name, sql in rows if "alembic" not in name}


def test_migrated_indexes_equal_the_models_indexes(engine: Engine, tmp_path: Path) -> None:
    """Alembic's comparison does not see an index's sort order; the database does (batch
    mode on SQLite once rebuilt the claim index without its DESC)."""
    if engine.dialect.name == "sqlite":
        fresh = create_engine(f"sqlite:///{tmp_path / 'fresh.db'}")
        SQLModel.metadata.create_all(fresh)
        expected = _index_definitions(fresh)
        fresh.dispose()
    else:
        with throwaway_postgres(migrate=False) as url:
            fresh = create_engine(url)
            SQLModel.metadata.create_all(fresh)
            expected = _index_definitions(fresh)
            fresh.dispose()
    migrated = _index_definitions(engine)
    assert migrated == expected
    assert any("priority DESC" in sql for sql in migrated.values())
