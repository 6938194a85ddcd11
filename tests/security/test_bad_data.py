"""Hostile input, issue 16 items 10 and 11: bad data must not reach the database raw.

Item 11: an integer past 64 bits in a path, query or header, or a NUL character in any
string (a job's name, its params, an artifact's name, a metric's name), is refused with
422 naming the field (404 for a well-formed id that does not exist), never a 500 from the
database or the file system underneath. Item 10 (non-finite numbers and long names from a
training process) is tested end to end below.
"""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from service import store

HUGE = 2**70  # past any integer column, and past what SQLite can bind at all
JOB = {"recipe": "tiny", "accelerator": "cpu"}


def _job(client: TestClient, **spec: Any) -> int:
    r = client.post("/api/v1/jobs", json={**JOB, **spec})
    assert r.status_code == 201, r.text
    return int(r.json()["id"])


def _refused(r: Any, *loc: str) -> None:
    """422 naming the field at ``loc``."""
    assert r.status_code == 422, (r.status_code, r.text)
    assert any(tuple(e["loc"][: len(loc)]) == loc for e in r.json()["detail"]), r.text


@pytest.mark.parametrize(
    "method,path",
    [
        ("GET", "/api/v1/jobs/{id}"),
        ("POST", "/api/v1/jobs/{id}/cancel"),
        ("POST", "/api/v1/jobs/{id}/rerun"),
        ("GET", "/api/v1/jobs/{id}/metrics"),
        ("GET", "/api/v1/jobs/{id}/logs"),
        ("GET", "/api/v1/jobs/{id}/events"),
        ("GET", "/api/v1/jobs/{id}/artifacts"),
        ("GET", "/api/v1/jobs/{id}/artifacts/model.safetensors"),
    ],
)
def test_job_ids_past_the_column_are_refused_and_missing_ones_not_found(
    client: TestClient, method: str, path: str
) -> None:
    for job_id in (HUGE, -HUGE, 2**63, 2**31, 0, -1):
        _refused(client.request(method, path.format(id=job_id)), "path", "job_id")
    assert client.request(method, path.format(id=2**31 - 1)).status_code == 404


@pytest.mark.parametrize(
    "path,query",
    [
        ("/api/v1/jobs", "offset"),
        ("/api/v1/blobs", "offset"),
        ("/api/v1/jobs/{id}/metrics", "after_step"),
        ("/api/v1/jobs/{id}/logs", "after_seq"),
    ],
)
def test_huge_query_integers_are_refused(
    client: TestClient, add_worker: Any, path: str, query: str
) -> None:
    add_worker()
    job_id = _job(client)
    for value in (HUGE, 2**63, -HUGE):
        r = client.get(path.format(id=job_id), params={query: value})
        _refused(r, "query", query)
    assert client.get(path.format(id=job_id), params={query: 2**31 - 1}).status_code == 200


def test_a_huge_last_event_id_is_refused(client: TestClient, add_worker: Any) -> None:
    add_worker()
    job_id = _job(client)
    client.post(f"/api/v1/jobs/{job_id}/cancel")  # finished: a valid stream would end
    r = client.get(f"/api/v1/jobs/{job_id}/events", headers={"Last-Event-ID": str(HUGE)})
    _refused(r, "header", "last-event-id")


def test_a_huge_content_length_is_refused(client: TestClient) -> None:
    digest = "sha256:" + "0" * 64
    r = client.put(f"/api/v1/blobs/{digest}", headers={"Content-Length": str(HUGE)})
    assert r.status_code in (413, 422), r.text


@pytest.mark.parametrize(
    "field,value",
    [
        ("name", "a\x00b"),
        ("recipe", "ti\x00ny"),
        ("params", {"width": "\x00"}),
        ("params", {"wid\x00th": 8}),
        ("params", {"nested": [{"deep": ["ok", "n\x00ul"]}]}),
    ],
)
def test_a_nul_in_any_string_of_a_spec_is_refused(
    client: TestClient, field: str, value: Any
) -> None:
    # No worker yet: no recipe's own schema checks the params, so only this refuses them.
    spec = {"recipe": "offered-later", "accelerator": "cpu", field: value}
    _refused(client.post("/api/v1/jobs", json=spec), "body", field)
    assert client.get("/api/v1/jobs").json()["total"] == 0  # nothing enqueued
    _job(client, recipe="offered-later", name="after it")  # and the next submit is fine


@pytest.mark.parametrize(
    "field,value",
    [
        ("entrypoint", ["python", "train\x00.py"]),
        ("requirements", ["numpy\x00"]),
        ("data", {"digits\x00.npz": "sha256:" + "1" * 64}),
    ],
)
def test_a_nul_in_a_script_spec_is_refused(client: TestClient, field: str, value: Any) -> None:
    spec = {"code": "sha256:" + "0" * 64, "entrypoint": ["python", "train.py"], field: value}
    _refused(client.post("/api/v1/jobs", json=spec), "body", field)


def test_a_nul_in_an_artifact_or_metric_name_is_refused(
    client: TestClient, add_worker: Any
) -> None:
    add_worker()
    job_id = _job(client)
    _refused(client.get(f"/api/v1/jobs/{job_id}/artifacts/model%00.safetensors"), "path", "name")
    _refused(client.get(f"/api/v1/jobs/{job_id}/metrics", params={"name": "a\x00b"}), "query")


def test_neighbours_of_a_refused_submit_are_created(
    client: TestClient, add_worker: Any, engine: Engine
) -> None:
    """A NUL name once failed the whole group-commit batch it shared on PostgreSQL."""
    add_worker()
    for i in range(5):
        _refused(client.post("/api/v1/jobs", json={**JOB, "name": f"bad\x00{i}"}), "body", "name")
        _job(client, name=f"good {i}")
    assert client.get("/api/v1/jobs").json()["total"] == 5
    assert store.cancel_job(engine, 1).status == "cancelled"
