"""Alembic environment: the models' metadata, the URL from settings unless given."""

from __future__ import annotations

from alembic import context
from sqlmodel import SQLModel

import service.blob_rows  # noqa: F401  (registers the tables on SQLModel.metadata)
import service.models  # noqa: F401
import service.sweeps.models  # noqa: F401
import service.webhooks.models  # noqa: F401
from service.db import is_sqlite, make_engine
from service.settings import Settings

config = context.config
target_metadata = SQLModel.metadata


def _url() -> str:
    return config.get_main_option("sqlalchemy.url") or Settings().database_url


def run_migrations_offline() -> None:
    context.configure(
        url=_url(), target_metadata=target_metadata, literal_binds=True, render_as_batch=True
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    engine = make_engine(_url())
    with engine.connect() as connection:
        if is_sqlite(engine):
            # Batch mode copies a table, drops the old one and renames the copy; with
            # foreign keys on, dropping `job` would cascade and delete every job's metrics
            # and logs. The pragma only takes effect outside a transaction: set it on the
            # driver's connection before SQLAlchemy begins one.
            connection.connection.driver_connection.execute("PRAGMA foreign_keys=OFF")  # type: ignore[union-attr]
        context.configure(
            connection=connection,
            target_metadata=target_metadata,
            render_as_batch=True,  # SQLite cannot ALTER most things; batch mode copies tables
            compare_type=True,
        )
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
