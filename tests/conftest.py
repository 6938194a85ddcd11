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
from tests.databases import empty, throwaway_postgres
from tests.object_store import OTHER_AWS_VARS, MotoProcess, S3Server, moto_process, s3_server

TESTS_DIR = Path(__file__).parent
RECIPES_DIR = TESTS_DIR / "recipes_dir"


@pytest.fixture(autouse=True)
def no_gpu_unless_marked(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test not marked ``gpu`` runs as on a CPU box, on a GPU box too: the workers it
    starts (and torch in this process) see no GPU, so its CPU slots are what it expects.
    ``gpu`` tests see the box's GPUs (``tests/gpu/cuda.py``)."""
    if request.node.get_closest_marker("gpu") is None:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """This run's PostgreSQL database (skipped where there is no server, unless required)."""
    with throwaway_postgres() as url:
        yield url


@pytest.fixture(scope="session")
def moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoProcess]:
    """This run's S3-compatible server (moto, in memory), started once, stopped at the end."""
    with moto_process(tmp_path_factory.mktemp("moto")) as process:
        yield process


@pytest.fixture
def s3(moto: MotoProcess, monkeypatch: pytest.MonkeyPatch) -> Iterator[S3Server]:
    """A fresh bucket and prefix on it behind a relay this test may stop and start; the
    ``AWS_`` variables point boto3 at it for the test."""
    with s3_server(moto) as server:
        for name, value in server.env.items():
            monkeypatch.setenv(name, value)
        for name in OTHER_AWS_VARS:
            monkeypatch.delenv(name, raising=False)
        yield server


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty, migrated database of each kind: every test that uses one runs on both."""
    if request.param == "postgresql":
        url: str = request.getfixturevalue("postgres_url")
        empty(url)
        return url
    url = f"sqlite:///{tmp_path / 'trainyard.db'}"
    upgrade(url)
    return url


@pytest.fixture
def settings(database_url: str, tmp_path: Path) -> Settings:
    # "testserver": the Host header of Starlette's TestClient
    return Settings(
        database_url=database_url,
        data_dir=tmp_path / "data",
        api_token=None,
        allowed_hosts=["testserver"],
    )


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
