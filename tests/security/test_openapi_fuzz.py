"""Hostile input: a schema fuzzer finds nothing.

schemathesis reads /openapi.json and sends what it allows and much that it does not
(integers past 64 bits, odd strings, wrong types, bodies that are not JSON), one call at
a time and in sequences that follow the links between routes (a submit's Location, then
that job). Every answer must be one the document declares (status, content type, body
schema, headers) and never a 500: an undeclared answer misleads Swagger's users and every
client generated from the document.

The run is the one ``st run`` makes (examples, coverage, fuzzing, then sequences),
in-process against the ASGI app, from a fixed seed and a bounded number of examples. Its
settings, and why each exception to its checks is right, are in schemathesis.toml beside
this file, which a longer run by hand reads too.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from fastapi import FastAPI
from fastapi.testclient import TestClient
from schemathesis.engine import Status, events, from_schema
from schemathesis.engine.recorder import ScenarioRecorder
from schemathesis.python import asgi
from schemathesis.schemas import BaseSchema

from service.app import create_app
from service.catalog import register_worker
from service.migrate import upgrade
from service.models import JOB_EXAMPLE, Worker
from service.settings import Settings
from tests.conftest import RECIPES_DIR

CONFIG = Path(__file__).with_name("schemathesis.toml")
TOKEN = "fuzz-token-0123456789abcdef"
HEADERS = {"Authorization": f"Bearer {TOKEN}"}
# A name the server answers to (the request guard refuses other Host headers).
BASE_URL = "http://localhost"
# Of each failure in the test's report: a fuzzed body can be megabytes.
MAX_REPORTED_CHARS = 2000


@pytest.fixture
def app(tmp_path: Path) -> FastAPI:
    """The API on its own migrated SQLite database, with a worker offering the recipes, a
    stored blob and a job, so calls reach past 404."""
    from workers.recipes import load_recipes

    url = f"sqlite:///{tmp_path / 'trainyard.db'}"
    upgrade(url)
    settings = Settings(database_url=url, data_dir=tmp_path / "data", api_token=TOKEN)
    app = create_app(settings)
    recipes = [r.describe() for r in load_recipes(RECIPES_DIR).values()]
    devices = [{"index": i, "kind": "cpu", "name": f"slot {i}"} for i in range(2)]
    worker = Worker(
        id="w1", hostname="fuzz", pid=1, accelerator="cpu", devices=devices, recipes=recipes
    )
    register_worker(app.state.engine, worker)
    with TestClient(app, base_url=BASE_URL, headers=HEADERS) as client:
        data = b"fuzzed"
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        assert client.put(f"/api/v1/blobs/{digest}", content=data).status_code == 201
        assert client.post("/api/v1/jobs", json=JOB_EXAMPLE).status_code == 201
    return app


@pytest.fixture
def api_schema(app: FastAPI) -> Iterator[BaseSchema]:
    """The app's OpenAPI document, loaded as schemathesis loads it, with the token."""
    config = schemathesis.Config.from_path(CONFIG)
    config.projects.default.update(base_url=BASE_URL, headers=HEADERS)
    yield schemathesis.openapi.from_asgi(
        "/openapi.json", app, config=config, headers={"Host": "localhost"}
    )
    asgi.shutdown_lifespans()  # schemathesis keeps an app's lifespan running until exit
    app.state.engine.dispose()


def test_fuzzer_finds_nothing(api_schema: BaseSchema) -> None:
    # The engine `st run` drives, rather than schemathesis's pytest plugin: the plugin's
    # fixture-loaded schema fails under pytest 9.2 (it sets Function._nodeid, now gone).
    found: dict[tuple[str, ...], str] = {}
    phases_run: set[str] = set()
    for event in from_schema(api_schema).execute():
        if isinstance(event, events.ScenarioFinished) and event.status != Status.SKIP:
            phases_run.add(event.phase.value)
        if isinstance(event, events.ScenarioFinished) and event.status == Status.FAILURE:
            found.update(_failures(event.recorder))
        elif isinstance(event, events.NonFatalError):
            found[(event.label, event.info.title)] = event.info.message
        elif isinstance(event, events.FatalError):
            raise event.exception
    assert phases_run >= {"examples", "coverage", "fuzzing", "stateful"}, phases_run
    assert not found, f"{len(found)} unique failures:\n\n" + "\n\n".join(found.values())


def _failures(recorder: ScenarioRecorder) -> Iterator[tuple[tuple[str, ...], str]]:
    """Each failed check of a scenario, once per operation and what went wrong, with the
    curl commands that reproduce it."""
    for checks in recorder.checks.values():
        for check in checks:
            info = check.failure_info
            if info is None:
                continue
            failure = info.failure
            label = failure.operation or recorder.label
            steps = "\n".join(step.curl for step in info.steps) or info.code_sample
            text = f"{label}: {failure.code} {failure.title}\n{failure.message}\n{steps}"
            yield (label, failure.code, failure.message), text[:MAX_REPORTED_CHARS]


def test_a_wrong_method_is_told_every_method_of_its_path(app: FastAPI) -> None:
    # Each method of a path is a route of its own; the first one matched had answered
    # 405 with only its own method in Allow.
    with TestClient(app, base_url=BASE_URL, headers=HEADERS) as client:
        jobs = client.request("OPTIONS", "/api/v1/jobs")
        blob = client.request("PATCH", "/api/v1/blobs/sha256:" + "0" * 64)
    assert jobs.status_code == 405
    assert sorted(jobs.headers["Allow"].split(", ")) == ["GET", "POST"]
    assert blob.status_code == 405
    assert sorted(blob.headers["Allow"].split(", ")) == ["DELETE", "GET", "HEAD", "PUT"]
