"""Apply the Alembic migrations from code (``trainyard migrate``, ``make run``, tests), and
tell whether a database's schema is the one this code needs (``serve``, ``worker``,
``/healthz``)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection
from sqlalchemy.engine import make_url

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"


def alembic_config(database_url: str) -> Config:
    """Alembic's configuration for one database."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("path_separator", "os")
    # ConfigParser interpolation: a literal % in a password must be doubled.
    config.set_main_option("sqlalchemy.url", database_url.replace("%", "%%"))
    return config


def upgrade(database_url: str) -> None:
    """Bring the database to the newest schema."""
    command.upgrade(alembic_config(database_url), "head")


def shown_url(database_url: str) -> str:
    """The database URL as it may be printed or logged: its password as ``***``."""
    return make_url(database_url).render_as_string(hide_password=True)


@functools.cache
def _scripts() -> ScriptDirectory:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("path_separator", "os")
    return ScriptDirectory.from_config(config)


@functools.cache
def head_revision() -> str:
    """The newest revision among this code's migrations (read from disk once)."""
    head = _scripts().get_current_head()
    if head is None:  # a checkout without migrations is broken, not "behind"
        raise RuntimeError(f"no Alembic migrations in {MIGRATIONS_DIR}")
    return head


@functools.cache
def known_revisions() -> frozenset[str]:
    """Every revision this code's migrations define."""
    return frozenset(script.revision for script in _scripts().walk_revisions())


@dataclass(frozen=True)
class SchemaState:
    """The revision a database is at (None: never migrated) and the one this code needs."""

    revision: str | None
    head: str

    @property
    def current(self) -> bool:
        return self.revision == self.head

    def problem(self) -> str | None:
        """What is wrong and what to do about it, or None when the schema is current."""
        if self.current:
            return None
        if self.revision is None:
            return "the database has no Trainyard schema yet: run `trainyard migrate`"
        if self.revision not in known_revisions():  # migrated by a newer Trainyard
            return (
                f"the database schema is at revision {self.revision}, which this Trainyard "
                f"does not know (it needs {self.head}): run the Trainyard that migrated it"
            )
        return (
            f"the database schema is at revision {self.revision}, this Trainyard needs "
            f"{self.head}: run `trainyard migrate`"
        )


def schema_state(conn: Connection) -> SchemaState:
    """Read the revision the database is at (a query or two; no writes)."""
    heads = MigrationContext.configure(conn).get_current_heads()
    return SchemaState(revision=",".join(heads) or None, head=head_revision())
