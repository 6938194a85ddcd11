"""Hostile input: bad data must not reach the database raw.

An integer past 64 bits in a path, query or header, or a NUL character in any
string (a job's name, its params, an artifact's name, a metric's name), is refused with
422 naming the field (404 for a well-formed id that does not exist), never a 500 from the
database or the file system underneath. Non-finite numbers and long names from a
training process are tested end to end below.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, select

from service import store
from service.db import read_session
from service.events import Event
from service.models import JobCreate, Metric
from service.points import MetricPoint, ProgressPoint
from service.store import Fence
from tests.recipes_dir.diverging import LONG_NAME
from tests.scripts import put_package
from tests.service.test_store import CLAIM
from tests.stack import Stack, running_stack
from workers.outcome import RunnerReport, decide
from workers.supervisor.reporter import DbReporter

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
        ("code", "sha256:\x00" + "0" * 63),
    ],
)
def test_a_nul_in_a_script_spec_is_refused(client: TestClient, field: str, value: Any) -> None:
    spec = {"code": "sha256:" + "0" * 64, "entrypoint": ["python", "train.py"], field: value}
    _refused(client.post("/api/v1/jobs", json=spec), "body", field)


def test_a_nul_in_an_idempotency_key_is_refused(client: TestClient) -> None:
    headers = {"Idempotency-Key": "retry\x00 1"}
    r = client.post("/api/v1/jobs", json={"recipe": "offered-later"}, headers=headers)
    _refused(r, "header", "idempotency-key")


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


# Numbers that are not finite, and names that do not fit, from training processes.


def _strict(text: str) -> Any:
    """JSON as a browser parses it: NaN and Infinity are not JSON."""

    def refuse(constant: str) -> Any:
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


@pytest.fixture
def stack(tmp_path: Path, database_url: str) -> Iterator[Stack]:
    with running_stack(tmp_path, database_url) as s:
        yield s


def _stream_data(stack: Stack, job_id: int) -> list[tuple[str, Any]]:
    """(event, data) of the job's whole event stream, every data line parsed strictly."""
    got: list[tuple[str, Any]] = []
    event = ""
    with stack.http.stream(
        "GET", f"/jobs/{job_id}/events", timeout=httpx.Timeout(10, read=60)
    ) as r:
        for line in r.iter_lines():
            if line.startswith("event:"):
                event = line.removeprefix("event:").strip()
            elif line.startswith("data:"):
                got.append((event, _strict(line.removeprefix("data:").strip())))
    assert got and got[-1][0] == "end"
    return got


@pytest.mark.slow
def test_a_recipe_whose_loss_is_not_finite_runs_to_its_end(stack: Stack) -> None:
    """A NaN loss once reached the event stream raw (and PostgreSQL refused its row,
    jamming the reporter); a recipe's metric name past the column did the same."""
    stack.start_worker()
    jobs = {
        loss: stack.submit(
            recipe="diverging",
            accelerator="cpu",
            epochs=2,
            batch_size=8,  # 16 steps an epoch: train/loss is recorded every 10
            params={"loss": loss},
        )
        for loss in ("nan", "inf")
    }
    for loss, job in jobs.items():
        done = stack.wait_status(job["id"], {"succeeded", "failed", "cancelled"}, 180)
        assert done["status"] == "succeeded", (loss, done)
        assert done["progress"]["loss"] is None and done["progress"]["step"] > 0
        assert done["result"]["val/loss"] is None and done["result"]["val/overflow"] is None
        assert done["result"]["val/ok"] == 0.5
        points = stack.http.get(f"/jobs/{job['id']}/metrics").json()
        by_name: dict[str, list[Any]] = {}
        for point in points:
            by_name.setdefault(point["name"], []).append(point["value"])
        nulls = ("train/loss", "train/epoch_loss", "val/loss", "val/overflow")
        assert set(by_name) >= {*nulls, "val/ok"}, by_name
        assert f"val/{LONG_NAME}" not in by_name
        assert all(
            v is None for n in ("train/loss", "val/loss", "val/overflow") for v in by_name[n]
        )
        assert by_name["val/ok"] == [0.5, 0.5]
        events = _stream_data(stack, job["id"])
        assert any(kind == "progress" and data["loss"] is None for kind, data in events)
        logs = stack.http.get(f"/jobs/{job['id']}/logs", params={"limit": 10_000}).json()
        assert any("not recorded" in line["text"] for line in logs), "the refusal is said"


SCRIPT = """
import json, os
with open(os.environ["TRAINYARD_METRICS_FILE"], "a") as f:
    for line in [
        {"step": 1, "loss": float("nan"), "up": float("inf"), "big": 10**400},
        {"step": 2, "x" * 10_000: 1.0},
        {"step": 3, "nul\\u0000name": 1.0},
        {"step": 4, "loss": 0.5},
    ]:
        f.write(json.dumps(line) + "\\n")
print("a NUL \\x00 in the output", flush=True)
"""


@pytest.mark.slow
def test_a_script_metrics_file_with_bad_numbers_and_names_runs_to_its_end(
    stack: Stack, tmp_path: Path
) -> None:
    """A 10,000-character metric name and a NUL in a name are refused (the line is
    skipped); non-finite values are stored as null; a NUL in its output is stored too."""
    package = tmp_path / "package"
    package.mkdir()
    (package / "train.py").write_text(SCRIPT)
    stack.start_worker()
    code = put_package(stack.http, package, tmp_path)
    job = stack.submit(code=code, entrypoint=["python", "train.py"], accelerator="cpu")
    done = stack.wait_status(job["id"], {"succeeded", "failed", "cancelled"}, 180)
    assert done["status"] == "succeeded", done
    assert done["result"] == {"loss": 0.5}
    points = stack.http.get(f"/jobs/{job['id']}/metrics").json()
    assert [(p["step"], p["name"], p["value"]) for p in points] == [
        (1, "big", None),
        (1, "loss", None),
        (1, "up", None),
        (4, "loss", 0.5),
    ]
    streamed = [data for kind, data in _stream_data(stack, job["id"]) if kind == "metric"]
    assert sorted(streamed, key=lambda p: (p["step"], p["name"])) == points
    logs = stack.http.get(f"/jobs/{job['id']}/logs", params={"limit": 10_000}).json()
    assert any("a NUL \ufffd in the output" in line["text"] for line in logs), logs


def test_the_event_stream_never_sends_nan() -> None:
    """A number stored before numbers were made finite (SQLite kept NaN in JSON) goes out
    as null: every data line parses."""
    progress = {"epoch": 1, "loss": math.nan, "eta_s": math.inf, "deep": [{"x": -math.inf}]}
    data = Event(7, "progress", progress).frame.decode().split("data: ", 1)[1].split("\n")[0]
    assert _strict(data) == {"epoch": 1, "loss": None, "eta_s": None, "deep": [{"x": None}]}


def test_points_are_finite_or_null_and_names_fit() -> None:
    point = ProgressPoint(epoch=1, epochs=1, step=1, total_steps=2, loss=math.nan, eta_s=-math.inf)
    assert (point.loss, point.eta_s) == (None, None)
    assert MetricPoint(name="m", step=1, epoch=1, value=math.inf, time=0.0).value is None
    for name in ("", "x" * 101, "a\x00b"):
        with pytest.raises(ValueError):
            MetricPoint(name=name, step=1, epoch=1, value=1.0, time=0.0)


def _running_job(engine: Engine) -> Fence:
    store.create_job(engine, JobCreate(recipe="r"))
    claimed = store.claim_job(engine, **CLAIM)
    assert claimed is not None
    return claimed.fence


def test_a_point_the_database_refuses_holds_back_no_other(engine: Engine) -> None:
    """Built past the checks (a step no column holds), as one that got past them would
    be: the reporter leaves it out and stores the rest, instead of retrying the batch
    until the lease runs out."""
    fence = _running_job(engine)
    reporter = DbReporter(engine, fence, flush_interval_s=3600).start()
    good = [MetricPoint(name="m", step=s, epoch=1, value=float(s), time=0.0) for s in (1, 2)]
    reporter.put_nowait(good[0])
    reporter.put_nowait(MetricPoint(name="m", step=2**70, epoch=1, value=1.0, time=0.0))
    reporter.put_nowait(good[1])
    reporter.put_nowait(ProgressPoint(epoch=1, epochs=1, step=2, total_steps=2, loss=0.5))
    reporter.close()  # writes what is queued, once
    with read_session(engine) as session:
        job = store.get_job(session, fence.job_id)
        rows = session.execute(select(Metric.step, Metric.value).order_by(Metric.step)).all()
    assert job.progress is not None and job.progress["loss"] == 0.5
    assert [tuple(r) for r in rows] == [(1, 1.0), (2, 2.0)]


@pytest.mark.parametrize(
    "body,field",
    [
        (b'{"recipe": "later", "lr": NaN}', "lr"),
        (b'{"recipe": "later", "epochs": Infinity}', "epochs"),
        (b'{"recipe": "later", "params": {"a": NaN}}', "params"),
        (b'{"recipe": "later", "params": {"a": [1, -Infinity]}}', "params"),
        (b'{"recipe": "later", "params": {"a": 1e999}}', "params"),
    ],
)
def test_a_number_json_does_not_have_is_refused(
    client: TestClient, body: bytes, field: str
) -> None:
    """Python's json reads NaN and Infinity: a spec holding one is refused (it once was
    stored, or answered 500 when the 422 could not be written as JSON)."""
    r = client.post("/api/v1/jobs", content=body, headers={"Content-Type": "application/json"})
    _refused(r, "body", field)
    _strict(r.text)
    assert client.get("/api/v1/jobs").json()["total"] == 0


def test_a_nul_in_a_failing_jobs_message_is_stored(engine: Engine) -> None:
    """A recipe's exception message becomes the job's reason, a text column: with a NUL
    in it PostgreSQL refused the finish, again at every try."""
    fence = _running_job(engine)
    error = {"type": "RuntimeError", "message": "bad \x00 byte", "code": "error"}
    report = RunnerReport(ok=False, error={**error, "retryable": False})
    outcome = decide(None, report, 1, timeout_s=None, stall_timeout_s=60, worker_id="w1")
    assert store.finish_attempt(engine, fence, outcome) is not None
    with read_session(engine) as session:
        job = store.get_job(session, fence.job_id)
    assert job.status == "failed" and job.reason_message == "RuntimeError: bad \ufffd byte"


def test_a_checkpoints_point_that_is_no_longer_valid_is_dropped_on_resume() -> None:
    """A checkpoint written before names were bounded may hold a 300-character metric
    name: resuming drops that point (the database would refuse it) rather than failing
    every attempt."""
    from workers.ranks.training.checkpoint import _points

    good = {"name": "train/loss", "step": 3, "epoch": 1, "value": 0.5, "time": 1.0}
    saved = [good, {**good, "name": "x" * 300}]
    points = _points(saved)
    assert [(p.name, p.step) for p in points] == [("train/loss", 3)]
