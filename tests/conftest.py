"""Fixtures: every test gets its own migrated SQLite database in tmp_path."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from service.app import create_app
from service.catalog import register_worker
from service.db import make_engine
from service.migrate import upgrade
from service.models import Worker
from service.settings import Settings

TESTS_DIR = Path(__file__).parent
RECIPES_DIR = TESTS_DIR / "recipes_dir"


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    db = tmp_path / "trainyard.db"
    upgrade(f"sqlite:///{db}")
    return Settings(database_url=f"sqlite:///{db}", data_dir=tmp_path / "data", api_token=None)


@pytest.fixture
def engine(settings: Settings) -> Iterator[Engine]:
    engine = make_engine(settings)
    yield engine
    engine.dispose()


@pytest.fixture
def client(settings: Settings, engine: Engine) -> Iterator[TestClient]:
    with TestClient(create_app(settings, engine)) as c:
        yield c


@pytest.fixture
def add_worker(engine: Engine) -> Callable[..., Worker]:
    """Register a worker row offering the built-in recipes, as a real worker would."""
    from workers.recipes import load_recipes

    described = [r.describe() for r in load_recipes(RECIPES_DIR).values()]

    def add(worker_id: str = "w1", slots: int = 2, accelerator: str = "cpu", **kw: Any) -> Worker:
        worker = Worker(
            id=worker_id,
            hostname="test",
            pid=1,
            accelerator=accelerator,
            devices=[{"index": i, "kind": accelerator, "name": f"slot {i}"} for i in range(slots)],
            recipes=described,
            **kw,
        )
        register_worker(engine, worker)
        return worker

    return add
