"""/healthz: the schema's revision, and not healthy while it is behind."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from alembic import command
from fastapi.testclient import TestClient

from service.app import create_app
from service.db import make_engine
from service.migrate import SchemaState, alembic_config, head_revision, known_revisions, upgrade
from service.settings import Settings


@contextmanager
def app_on(url: str, tmp_path: Path) -> Iterator[TestClient]:
    settings = Settings(database_url=url, data_dir=tmp_path / "data")
    engine = make_engine(settings)
    try:
        # 127.0.0.1: a Host the server answers to by default
        with TestClient(create_app(settings, engine), base_url="http://127.0.0.1") as client:
            yield client
    finally:
        engine.dispose()


def test_healthz_reports_the_revision_of_a_current_schema(
    database_url: str, tmp_path: Path
) -> None:
    with app_on(database_url, tmp_path) as client:
        r = client.get("/healthz")
    assert r.status_code == 200, r.text
    assert r.json() == {
        "status": "ok",
        "database": "ok",
        "schema": {"revision": head_revision(), "head": head_revision()},
    }


def test_healthz_is_503_on_a_database_never_migrated(tmp_path: Path) -> None:
    with app_on(f"sqlite:///{tmp_path / 'empty.db'}", tmp_path) as client:
        r = client.get("/healthz")
    assert r.status_code == 503, r.text
    assert r.json()["schema"] == {"revision": None, "head": head_revision()}
    assert "run `trainyard migrate`" in r.json()["detail"]


def test_healthz_is_503_while_the_schema_is_behind(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    older = sorted(known_revisions())[-2]  # revisions here are numbered 0001, 0002, ...
    command.upgrade(alembic_config(url), older)
    with app_on(url, tmp_path) as client:
        r = client.get("/healthz")
        assert r.status_code == 503, r.text
        assert r.json()["schema"] == {"revision": older, "head": head_revision()}
        assert "run `trainyard migrate`" in r.json()["detail"]

        upgrade(url)  # healthy once migrated, without a restart
        assert client.get("/healthz").status_code == 200


def test_a_schema_newer_than_this_code_says_which_trainyard_to_run() -> None:
    state = SchemaState(revision="9999", head=head_revision())
    assert not state.current
    assert "does not know" in str(state.problem()) and "migrate`" not in str(state.problem())
    assert SchemaState(revision=head_revision(), head=head_revision()).problem() is None
