"""The jobs API against a real SQLite database, one per test."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from service import store
from service.catalog import register_worker
from service.models import JobStatus, Worker
from service.points import MetricPoint, ProgressPoint
from service.reasons import ReasonCode as R
from service.store import Fence, Outcome

SPEC = {
    "recipe": "mlp-regression",
    "strategy": "ddp",
    "devices": 2,
    "accelerator": "cpu",
    "epochs": 5,
}


def submit(client: TestClient, **overrides: Any) -> dict[str, Any]:
    r = client.post("/api/v1/jobs", json={**SPEC, **overrides})
    assert r.status_code == 201, r.text
    return r.json()


def test_submit_then_get(client: TestClient, add_worker: Any) -> None:
    add_worker()
    r = client.post("/api/v1/jobs", json=SPEC)
    assert r.status_code == 201
    job = r.json()
    assert r.headers["location"] == f"/api/v1/jobs/{job['id']}"
    assert job["status"] == "queued" and job["attempt"] == 1
    assert job["reason"]["code"] == "queued"
    got = client.get(f"/api/v1/jobs/{job['id']}").json()
    assert got["id"] == job["id"] and got["queue_position"] == 1
    assert got["params"] == {} and got["batch_size"] == 64 and got["optimizer"] == "adamw"


def test_no_worker_yet_job_waits_with_reason(client: TestClient) -> None:
    job = submit(client, recipe="anything-at-all")
    assert job["status"] == "queued"
    assert job["reason"]["code"] == "no_worker"


def test_list_newest_first_with_filter_and_paging(
    client: TestClient, add_worker: Any, engine: Engine
) -> None:
    add_worker()
    ids = [submit(client)["id"] for _ in range(3)]
    store.cancel_job(engine, ids[0])
    page = client.get("/api/v1/jobs", params={"limit": 2}).json()
    assert [j["id"] for j in page["items"]] == [ids[2], ids[1]]
    assert page["total"] == 3
    cancelled = client.get("/api/v1/jobs", params={"status": "cancelled"}).json()
    assert [j["id"] for j in cancelled["items"]] == [ids[0]]
    assert client.get("/api/v1/jobs", params={"status": "bogus"}).status_code == 422


def test_idempotency_key_returns_the_same_job(client: TestClient, add_worker: Any) -> None:
    add_worker()
    headers = {"Idempotency-Key": "abc-123"}
    first = client.post("/api/v1/jobs", json=SPEC, headers=headers)
    again = client.post("/api/v1/jobs", json=SPEC, headers=headers)
    assert first.status_code == again.status_code == 201
    assert first.json()["id"] == again.json()["id"]
    assert client.get("/api/v1/jobs").json()["total"] == 1
    other = client.post("/api/v1/jobs", json={**SPEC, "epochs": 6}, headers=headers)
    assert other.status_code == 409


def test_unknown_job_is_404(client: TestClient) -> None:
    for path in (
        "/api/v1/jobs/999",
        "/api/v1/jobs/999/metrics",
        "/api/v1/jobs/999/logs",
        "/api/v1/jobs/999/artifacts",
    ):
        r = client.get(path)
        assert r.status_code == 404 and "999" in r.json()["detail"]
    assert client.post("/api/v1/jobs/999/cancel").status_code == 404


def test_cancel_queued_is_immediate_and_idempotent(client: TestClient, add_worker: Any) -> None:
    add_worker()
    job = submit(client)
    r = client.post(f"/api/v1/jobs/{job['id']}/cancel")
    assert r.status_code == 202 and r.json()["status"] == "cancelled"
    again = client.post(f"/api/v1/jobs/{job['id']}/cancel")
    assert again.status_code == 202 and again.json()["status"] == "cancelled"


def _claim(engine: Engine) -> Fence:
    job = store.claim_job(
        engine,
        worker_id="w1",
        free_devices=2,
        accelerator="cpu",
        recipes=["mlp-regression"],
        lease_s=30,
    )
    assert job is not None
    return job.fence


def test_cancel_running_becomes_cancelling(
    client: TestClient, add_worker: Any, engine: Engine
) -> None:
    add_worker()
    job = submit(client)
    _claim(engine)
    r = client.post(f"/api/v1/jobs/{job['id']}/cancel")
    assert r.status_code == 202 and r.json()["status"] == "cancelling"
    assert client.post(f"/api/v1/jobs/{job['id']}/cancel").json()["status"] == "cancelling"


def test_cancel_finished_is_409(client: TestClient, add_worker: Any, engine: Engine) -> None:
    add_worker()
    job = submit(client)
    fence = _claim(engine)
    store.finish_attempt(engine, fence, Outcome(JobStatus.succeeded, R.succeeded, "trained"))
    r = client.post(f"/api/v1/jobs/{job['id']}/cancel")
    assert r.status_code == 409 and "succeeded" in r.json()["detail"]


def test_metrics_and_logs_read_back_in_order(
    client: TestClient, add_worker: Any, engine: Engine
) -> None:
    add_worker()
    job = submit(client)
    fence = _claim(engine)
    points = [
        MetricPoint(name="train/loss", step=s, epoch=1, value=1.0 / s, time=0.0)
        for s in (10, 20, 30)
    ]
    progress = ProgressPoint(epoch=1, epochs=1, step=30, total_steps=30)
    assert store.report(engine, fence, progress=progress, metrics=points)
    assert store.report(engine, fence, metrics=points[:1])  # a resumed run re-sends a step
    lines = [(0.0, "stdout", "one"), (0.0, "stderr", "two")]
    assert store.append_logs(engine, fence, lines, max_lines=100)
    assert store.append_logs(engine, fence, [(0.0, "stdout", "three")], max_lines=100)
    metrics = client.get(f"/api/v1/jobs/{job['id']}/metrics", params={"name": "train/loss"}).json()
    assert [m["step"] for m in metrics] == [10, 20, 30]
    after = client.get(f"/api/v1/jobs/{job['id']}/metrics", params={"after_step": 10}).json()
    assert [m["step"] for m in after] == [20, 30]
    logs = client.get(f"/api/v1/jobs/{job['id']}/logs").json()
    assert [(x["stream"], x["text"]) for x in logs] == [
        ("stdout", "one"),
        ("stderr", "two"),
        ("stdout", "three"),
    ]
    seqs = [x["seq"] for x in logs]
    assert seqs == sorted(set(seqs))  # numbered in order (metric points share the numbers)
    paged = client.get(f"/api/v1/jobs/{job['id']}/logs", params={"after_seq": seqs[1]}).json()
    assert [x["text"] for x in paged] == ["three"]


def test_artifacts_list_download_and_no_escape(
    client: TestClient, settings: Any, add_worker: Any
) -> None:
    add_worker()
    job = submit(client)
    folder = settings.data_dir / "jobs" / str(job["id"])
    (folder / ".runner").mkdir(parents=True)
    (folder / "spec.json").write_text("{}")
    (folder / ".runner" / "attempt-1.json").write_text("{}")
    (settings.data_dir / "secret.txt").write_text("no")
    listed = client.get(f"/api/v1/jobs/{job['id']}/artifacts").json()
    assert [a["name"] for a in listed] == ["spec.json"]
    assert client.get(f"/api/v1/jobs/{job['id']}/artifacts/spec.json").content == b"{}"
    for bad in ("../../secret.txt", "..%2F..%2Fsecret.txt", ".runner/attempt-1.json", "nope"):
        r = client.get(f"/api/v1/jobs/{job['id']}/artifacts/{bad}")
        # the client may normalise "../" away, leaving a path that is not a job at all (422)
        assert r.status_code in (404, 422) and r.content != b"no", bad


BAD_SPECS = [
    ({"recipe": "nope"}, ["recipe"], "mlp-classifier"),
    ({"params": {"hidden": "wide"}}, ["params", "hidden"], "integer"),
    ({"params": {"colour": 1}}, ["params"], "colour"),
    ({"epochs": 0}, ["epochs"], "greater than or equal to 1"),
    ({"epochs": 100_001}, ["epochs"], "less than or equal"),
    ({"batch_size": 0}, ["batch_size"], "greater than or equal to 1"),
    ({"batch_size": 63}, ["batch_size"], "multiple of devices"),
    ({"devices": 0}, ["devices"], "greater than or equal to 1"),
    ({"devices": 3, "batch_size": 63}, ["devices"], "largest worker"),
    ({"lr": 0}, ["lr"], "greater than 0"),
    ({"lr": -1}, ["lr"], "greater than 0"),
    ({"strategy": "fsdp"}, ["strategy"], "'auto', 'single', 'dp' or 'ddp'"),
    ({"optimizer": "lion"}, ["optimizer"], "adamw"),
    ({"precision": "fp8"}, ["precision"], "bf16"),
    ({"accelerator": "tpu"}, ["accelerator"], "cuda"),
    ({"accelerator": "cuda"}, ["accelerator"], "CUDA"),
    ({"strategy": "dp", "devices": 2}, ["strategy"], "use ddp"),
    ({"strategy": "single", "devices": 2}, ["devices"], "exactly one device"),
    ({"name": "x" * 101}, ["name"], "at most 100 characters"),
    ({"priority": 101}, ["priority"], "less than or equal to 100"),
    ({"max_attempts": 11}, ["max_attempts"], "less than or equal to 10"),
    ({"timeout_s": 0}, ["timeout_s"], "greater than or equal to 1"),
    ({"epochs": "many"}, ["epochs"], "integer"),
    ({"surprise": True}, ["surprise"], "unknown field 'surprise'"),
]


@pytest.mark.parametrize(("change", "loc", "says"), BAD_SPECS)
def test_bad_spec_is_422_naming_the_field(
    client: TestClient, add_worker: Any, change: dict[str, Any], loc: list[str], says: str
) -> None:
    add_worker()
    r = client.post("/api/v1/jobs", json={**SPEC, **change})
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert any(d["loc"][1 : 1 + len(loc)] == loc and says in d["msg"] for d in detail), detail
    assert client.get("/api/v1/jobs").json()["total"] == 0  # nothing enqueued


def test_missing_recipe_and_non_json_body(client: TestClient, add_worker: Any) -> None:
    add_worker()
    r = client.post("/api/v1/jobs", json={"epochs": 1})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "recipe"]
    r = client.post(
        "/api/v1/jobs", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert r.status_code == 422 and r.json()["detail"][0]["type"] == "json_invalid"
    r = client.post("/api/v1/jobs", content=b"[1, 2]", headers={"content-type": "application/json"})
    assert r.status_code == 422


def test_oversized_body_is_413(client: TestClient) -> None:
    r = client.post("/api/v1/jobs", json={**SPEC, "params": {"blob": "x" * 2_000_000}})
    assert r.status_code == 413 and "larger than" in r.json()["detail"]


def test_recipes_and_workers_listing(client: TestClient, add_worker: Any) -> None:
    assert client.get("/api/v1/recipes").json() == []
    add_worker("box-a", slots=2)
    recipes = {r["name"]: r for r in client.get("/api/v1/recipes").json()}
    assert {"mlp-regression", "mlp-classifier", "tiny"} <= set(recipes)
    schema = recipes["mlp-classifier"]["params_schema"]
    assert schema["additionalProperties"] is False and "classes" in schema["properties"]
    assert len(recipes["mlp-regression"]["source_hash"]) == 64
    (worker,) = client.get("/api/v1/workers").json()
    assert worker["id"] == "box-a" and len(worker["devices"]) == 2 and worker["alive"]


def test_rerun_submits_an_identical_job(client: TestClient, add_worker: Any) -> None:
    add_worker()
    first = submit(client, params={"hidden": 8}, seed=42, priority=3, name="original")
    r = client.post(f"/api/v1/jobs/{first['id']}/rerun")
    assert r.status_code == 201
    again = r.json()
    assert again["id"] != first["id"] and r.headers["location"] == f"/api/v1/jobs/{again['id']}"
    spec_fields = ("name", "recipe", "params", "strategy", "devices", "accelerator", "epochs",
                   "batch_size", "lr", "optimizer", "seed", "precision", "priority",
                   "max_attempts", "timeout_s", "checkpoint_every")  # fmt: skip
    assert {k: again[k] for k in spec_fields} == {k: first[k] for k in spec_fields}
    assert again["status"] == "queued" and again["attempt"] == 1
    assert client.post("/api/v1/jobs/999/rerun").status_code == 404


def test_a_worker_registered_a_moment_ago_is_seen_by_the_next_submit(
    client: TestClient, engine: Engine, add_worker: Any
) -> None:
    # The catalog is cached for a second; a spec it would refuse is checked again as of now.
    # (An empty catalog is trusted for that second: tests/service/test_catalog.py.)
    devices = [{"index": i, "kind": "cpu", "name": f"slot {i}"} for i in range(2)]
    register_worker(
        engine, Worker(id="w0", hostname="t", pid=1, accelerator="cpu", devices=devices)
    )
    r = client.post("/api/v1/jobs", json={**SPEC, "recipe": "tiny"})
    assert r.status_code == 422  # cached: a worker that offers no recipe
    add_worker()  # offers the tests' recipes, tiny included
    bad = client.post("/api/v1/jobs", json={**SPEC, "recipe": "tiny", "params": {"width": -1}})
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"][:3] == [
        "body",
        "params",
        "width",
    ]
    job = submit(client, recipe="tiny", params={"width": 4})
    assert job["reason"]["code"] == "queued"


def test_links_a_script_leaves_in_its_output_reach_nothing_outside_its_folder(
    client: TestClient, settings: Any, add_worker: Any
) -> None:
    """A script writes what it likes to $TRAINYARD_OUTPUT_DIR, links included: none of
    them may serve another job's files or the box's (or loop the listing)."""
    add_worker()
    mine, other = submit(client), submit(client)
    out = settings.data_dir / "jobs" / str(mine["id"]) / "output"
    theirs = settings.data_dir / "jobs" / str(other["id"])
    out.mkdir(parents=True)
    theirs.mkdir(parents=True)
    (theirs / "model.safetensors").write_bytes(b"their weights")
    (out / "weights.pt").write_bytes(b"mine")
    (out / "theirs").symlink_to(theirs / "model.safetensors")
    (out / "their-folder").symlink_to(theirs)
    (out / "passwd").symlink_to("/etc/passwd")
    (out / "loop").symlink_to(out)
    listed = client.get(f"/api/v1/jobs/{mine['id']}/artifacts").json()
    assert [a["name"] for a in listed] == ["output/weights.pt"]
    for name in ("output/theirs", "output/their-folder/model.safetensors", "output/passwd"):
        r = client.get(f"/api/v1/jobs/{mine['id']}/artifacts/{name}")
        assert r.status_code == 404 and b"weights" not in r.content and b"root" not in r.content
