"""What a refused request is told: every unknown field of a spec at once, its params'
with the rest, each with the close names it may have meant; a recipe that cannot be
checked because no worker runs is not called unknown; a boolean is no number; a JSON
body past the limit is a 413. On a real SQLite file and on PostgreSQL."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, update

from service.db import write_session
from service.models import Worker, utcnow

SPEC = {"recipe": "mlp-regression", "accelerator": "cpu", "devices": 1}


def refused(client: TestClient, spec: dict[str, Any]) -> list[dict[str, Any]]:
    r = client.post("/api/v1/jobs", json=spec)
    assert r.status_code == 422, r.text
    assert client.get("/api/v1/jobs").json()["total"] == 0
    detail: list[dict[str, Any]] = r.json()["detail"]
    return detail


def test_every_unknown_field_and_the_params_problems_come_in_one_answer(
    client: TestClient, add_worker: Any
) -> None:
    """The recipe's params were checked only once the rest of the spec passed: a spec with
    typos was refused once for ``epoch`` and ``batchsize``, then again for ``hiden``."""
    add_worker()
    spec = {**SPEC, "epoch": 3, "batchsize": 32, "params": {"hiden": 8, "layers": 0}}
    detail = refused(client, spec)
    by_loc = {tuple(e["loc"]): e["msg"] for e in detail}
    assert by_loc[("body", "epoch")] == "unknown field 'epoch'; did you mean 'epochs'?"
    assert by_loc[("body", "batchsize")] == "unknown field 'batchsize'; did you mean 'batch_size'?"
    assert by_loc[("body", "params", "hiden")] == "unknown field 'hiden'; did you mean 'hidden'?"
    assert "minimum of 1" in by_loc[("body", "params", "layers")]
    assert len(detail) == 4


def test_unknown_params_alone_are_told_the_names_they_may_mean(
    client: TestClient, add_worker: Any
) -> None:
    add_worker()
    detail = refused(client, {**SPEC, "params": {"hiden": 8, "zzz": 1}})
    assert [(e["loc"], e["msg"]) for e in detail] == [
        (["body", "params", "hiden"], "unknown field 'hiden'; did you mean 'hidden'?"),
        (["body", "params", "zzz"], "unknown field 'zzz'"),
    ]


def test_a_recipe_is_not_called_unknown_while_no_worker_runs(
    client: TestClient, add_worker: Any, engine: Engine
) -> None:
    """Workers from an earlier run stay registered but stopped: until this run's worker
    registers, a recipe only it offers was refused as unknown."""
    add_worker()
    with write_session(engine) as session:  # as a worker stopped a minute ago
        a_minute_ago = utcnow() - timedelta(minutes=1)
        session.execute(update(Worker).values(stopped_at=a_minute_ago))
    detail = refused(client, {**SPEC, "recipe": "in-recipes-dir-only"})
    assert detail[0]["loc"] == ["body", "recipe"]
    assert "no worker is running" in detail[0]["msg"]
    assert "recipes are known once a worker has registered" in detail[0]["msg"]
    assert "unknown recipe" not in detail[0]["msg"]
    add_worker()  # it registers: now the recipe is unknown, and said so
    assert refused(client, {**SPEC, "recipe": "in-recipes-dir-only"})[0]["msg"].startswith(
        "unknown recipe 'in-recipes-dir-only'"
    )


@pytest.mark.parametrize("field", ["devices", "epochs", "batch_size", "seed", "lr"])
def test_a_boolean_is_not_a_number_in_a_spec(
    client: TestClient, add_worker: Any, field: str
) -> None:
    add_worker()
    detail = refused(client, {**SPEC, field: True})
    assert detail[0]["loc"] == ["body", field]


def test_a_boolean_is_not_a_number_in_a_token_or_a_quota(client: TestClient) -> None:
    """``{"expires_in_days": true}`` made a token that expired in a day (201)."""
    token = client.post("/api/v1/users/admin/tokens", json={"expires_in_days": True})
    assert token.status_code == 422, token.text
    assert token.json()["detail"][0]["loc"] == ["body", "expires_in_days"]
    assert client.post("/api/v1/users", json={"name": "ann"}).status_code == 201
    quota = client.patch("/api/v1/users/ann/quotas", json={"max_queued_jobs": False})
    assert quota.status_code == 422, quota.text
    ok = client.post("/api/v1/users/admin/tokens", json={"expires_in_days": 2})
    assert ok.status_code == 201, ok.text
    # JSON Schema's integer: 2.0 is one; "2" and 2.5 are not
    whole = client.patch("/api/v1/users/ann/quotas", json={"max_queued_jobs": 2.0})
    assert whole.status_code == 200 and whole.json()["max_queued_jobs"] == 2, whole.text
    for bad in ("2", 2.5):
        r = client.patch("/api/v1/users/ann/quotas", json={"max_queued_jobs": bad})
        assert r.status_code == 422, r.text


def test_a_json_body_past_the_limit_is_413_whether_its_length_is_said_or_not(
    client: TestClient, add_worker: Any
) -> None:
    add_worker()
    body = json.dumps({**SPEC, "name": "x" * 3_000_000}).encode()
    headers = {"Content-Type": "application/json"}
    said = client.post("/api/v1/jobs", content=body, headers=headers)
    streamed = client.post(
        "/api/v1/jobs", content=iter([body[:1000], body[1000:]]), headers=headers
    )
    for r in (said, streamed):
        assert r.status_code == 413, r.text
        assert "TRAINYARD_MAX_BODY_BYTES" in r.json()["detail"]
    assert client.get("/api/v1/jobs").json()["total"] == 0


def test_the_published_schema_keeps_the_bounds_of_optional_numbers(client: TestClient) -> None:
    """The document says what the server checks: an optional integer's bounds are
    JSON Schema's minimum and maximum, which clients and fuzzers read."""
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    for model, field, bounds in [
        ("TokenCreate", "expires_in_days", {"minimum": 1, "maximum": 3650}),
        ("UserQuotas", "max_queued_jobs", {"minimum": 1, "maximum": 100_000_000}),
        ("JobCreate", "timeout_s", {"minimum": 1, "maximum": 365 * 24 * 3600}),
        ("JobCreate", "gpu_memory_gb", {"exclusiveMinimum": 0, "maximum": 4096}),
    ]:
        number = schemas[model]["properties"][field]["anyOf"][0]
        assert bounds.items() <= number.items(), (model, field, number)
