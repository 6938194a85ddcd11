"""Sweeps at the service level, on both databases: every space refused at submit names
what is wrong; a trial's spec; two drivers on one sweep (the lease, its fence, a
takeover that rebuilds the study and counts no trial twice); cancel and its rights.

The worker's side is played through the store's own functions (claim, report, finish),
so these run in a second; tests/e2e/test_sweeps.py runs sweeps on real workers."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, update
from sqlmodel import col

from service import store
from service.app import create_app
from service.catalog import CatalogCache
from service.db import read_session, write_session
from service.models import Job, JobStatus
from service.points import MetricPoint
from service.reasons import ReasonCode as R
from service.settings import Settings
from service.store import Outcome, sweep_reads
from service.sweeps import search  # noqa: F401  (Optuna imported before the lease clock runs)
from service.sweeps.driver import Driver
from service.sweeps.models import Sweep, SweepCreate
from service.sweeps.space import trial_spec
from tests.stack import wait_for

TINY = {"recipe": "tiny", "accelerator": "cpu"}
GOOD: dict[str, Any] = {
    "job": TINY,
    "parameters": {
        "lr": {"type": "float", "low": 1e-3, "high": 0.1, "log": True},
        "params.width": {"type": "categorical", "values": [4, 8]},
    },
    "metric": "val/loss",
    "max_trials": 4,
}


def refused(client: TestClient, **changes: Any) -> list[dict[str, Any]]:
    r = client.post("/api/v1/sweeps", json={**GOOD, **changes})
    assert r.status_code == 422, r.text
    return r.json()["detail"]  # type: ignore[no-any-return]


def where(detail: list[dict[str, Any]]) -> list[str]:
    return [".".join(map(str, e["loc"][1:])) for e in detail]


def test_every_bad_space_is_refused_naming_what_is_wrong(
    client: TestClient, add_worker: Callable[..., Any]
) -> None:
    add_worker()
    ranges = {
        "nope": ({"type": "int", "low": 1, "high": 3}, "is not a field of the job"),
        "recipe": ({"type": "categorical", "values": ["a"]}, "is what the job is"),
        "epochs": ({"type": "int", "low": 5, "high": 2}, "an empty range: low (5) is above"),
        "lr": ({"type": "float", "low": 0, "high": 0.1, "log": True}, "log scale needs low > 0"),
        "batch_size": ({"type": "int", "low": 32, "high": 100, "step": 32}, "not a multiple"),
        "seed": ({"type": "categorical", "values": [1, 1]}, "values repeat"),
    }
    for name, (space, words) in ranges.items():
        detail = refused(client, parameters={name: space})
        assert where(detail) == [f"parameters.{name}"], detail
        assert words in detail[0]["msg"], detail
    # values the job refuses: the recipe's params schema, an integer field
    detail = refused(client, parameters={"params.width": {"type": "int", "low": 1, "high": 5000}})
    assert where(detail) == ["parameters.params.width"] and "5000" in detail[0]["msg"]
    detail = refused(client, parameters={"batch_size": {"type": "float", "low": 32, "high": 64}})
    assert where(detail) == ["parameters.batch_size"] and "integer" in detail[0]["msg"]
    # the grid
    detail = refused(client, search="grid", max_trials=1)
    assert where(detail) == ["parameters.lr"] and "give a step, or values" in detail[0]["msg"]
    grid = {"params.width": {"type": "int", "low": 1, "high": 8}}
    detail = refused(client, search="grid", parameters=grid, max_trials=5)
    assert where(detail) == ["max_trials"] and "the grid has 8 points" in detail[0]["msg"]
    assert where(refused(client, max_trials=None)) == ["max_trials"]
    huge = {"params.width": {"type": "int", "low": 0, "high": 2**31 - 1}}
    detail = refused(client, search="grid", parameters=huge, max_trials=5)
    assert where(detail) == ["parameters"] and "at most 10000" in detail[0]["msg"]
    wide = {"lr": {"type": "float", "low": -1e308, "high": 1e308, "step": 1}}
    assert where(refused(client, parameters=wide)) == ["parameters.lr"]
    # the metric, the pruner, the job itself
    detail = refused(client, metric="val/accuracy")
    assert where(detail) == ["metric"] and "never reports 'val/accuracy'" in detail[0]["msg"]
    by_step = {"type": "hyperband", "resource": "step"}
    assert where(refused(client, pruner=by_step)) == ["pruner.max_resource"]
    assert where(refused(client, job={**TINY, "recipe": "no-such"})) == ["job.recipe"]
    assert where(refused(client, pruner={"type": "pbt"}))[0].startswith("pruner")
    # nothing was stored
    assert client.get("/api/v1/sweeps").json()["total"] == 0


def test_a_scripts_parameter_is_a_placeholder_or_a_field_it_takes() -> None:
    script = {"code": "sha256:" + "0" * 64, "accelerator": "cpu"}
    sweep = SweepCreate.model_validate(
        {
            "name": "s",
            "job": {**script, "entrypoint": ["python", "t.py", "--lr={lr}", "--on", "{flag}"]},
            "parameters": {
                "lr": {"type": "float", "low": 0.1, "high": 0.2},
                "flag": {"type": "categorical", "values": [True]},
                "params.depth": {"type": "int", "low": 1, "high": 3},
                "timeout_s": {"type": "int", "low": 60, "high": 120},
            },
            "metric": "m",
            "max_trials": 2,
        }
    )
    values = {"lr": 0.15, "flag": True, "params.depth": 2, "timeout_s": 90}
    spec = trial_spec(sweep, values, 7)
    assert spec.entrypoint == ["python", "t.py", "--lr=0.15", "--on", "true"]
    assert spec.params == {"lr": 0.15, "flag": True, "depth": 2, "timeout_s": 90}
    assert spec.timeout_s == 90 and spec.lr == 1e-3 and spec.name == "s #7"


def test_a_scripts_stray_parameter_is_refused() -> None:
    job = {"code": "sha256:" + "0" * 64, "entrypoint": ["python", "t.py"], "accelerator": "cpu"}
    from service.errors import SpecInvalid
    from service.sweeps.space import check

    sweep = SweepCreate.model_validate(
        {**GOOD, "job": job, "parameters": {"lr": {"type": "float", "low": 0.1, "high": 0.2}}}
    )
    with pytest.raises(SpecInvalid) as caught:
        check(sweep, lambda spec: None, None)
    assert caught.value.errors[0]["loc"] == ["body", "parameters", "lr"]
    assert "nor {lr} in its entrypoint" in caught.value.errors[0]["msg"]


def play_worker(engine: Engine, value_of: Callable[[int], float]) -> int:
    """Claim every queued job, report val/loss for epochs 1 and 2, succeed; how many."""
    done = 0
    while (claimed := store.claim_job(engine, **WORKER)) is not None:
        fence = claimed.fence
        now = time.time()
        points = [
            MetricPoint("val/loss", epoch, epoch, value_of(fence.job_id) / epoch, now)
            for epoch in (1, 2)
        ]
        assert store.report(engine, fence, metrics=points)
        store.finish_attempt(engine, fence, Outcome(JobStatus.succeeded, R.succeeded, "ok"))
        done += 1
    return done


WORKER = {
    "worker_id": "w1",
    "free_devices": 2,
    "accelerator": "cpu",
    "recipes": ["tiny"],
    "lease_s": 30.0,
}


@pytest.fixture
def undriven(settings: Settings, engine: Engine) -> Iterator[TestClient]:
    """The API without its own sweep driver: the test's drivers are the only ones."""
    app = create_app(settings.model_copy(update={"sweep_driver": False}), engine)
    with TestClient(app) as client:
        yield client


def test_two_drivers_share_a_sweep_by_its_lease_and_count_no_trial_twice(
    undriven: TestClient, engine: Engine, settings: Settings, add_worker: Callable[..., Any]
) -> None:
    client = undriven
    add_worker()
    body = {
        **GOOD,
        "parameters": {"params.width": {"type": "categorical", "values": [1, 2, 3, 4, 5, 6]}},
        "search": "grid",
        "max_trials": None,
        "max_parallel": 2,
    }
    sweep_id = client.post("/api/v1/sweeps", json=body).json()["id"]
    quick = settings.model_copy(update={"sweep_lease_s": 1.0})
    first, second = (Driver(engine, quick, CatalogCache()) for _ in range(2))
    width = {}

    def value_of(job_id: int) -> float:
        if job_id not in width:
            widths()
        return float(width[job_id])

    def widths() -> None:
        with read_session(engine) as session:
            for row in sweep_reads.trials(session, sweep_id):
                width[row.job_id] = row.values["params.width"]

    first.drive()
    second.drive()  # the sweep is the first's: the second takes nothing
    assert list(first.held) == [sweep_id] and not second.held
    widths()
    assert play_worker(engine, value_of) == 2
    first.drive()  # two trials ended, two more started
    widths()
    assert len(width) == 4
    # the first driver stops (its process killed): once its lease runs out the second
    # takes the sweep over, rebuilds the study from the rows and carries on
    wait_for(lambda: (second.drive(), bool(second.held))[1], 5, "the takeover")
    first.drive()  # the first wakes up: its writes are fenced off, it lets go
    assert not first.held
    while client.get(f"/api/v1/sweeps/{sweep_id}").json()["status"] == "running":
        play_worker(engine, value_of)
        widths()
        second.drive()
    done = client.get(f"/api/v1/sweeps/{sweep_id}").json()
    assert [t["number"] for t in done["trials"]] == [0, 1, 2, 3, 4, 5]
    assert sorted(t["values"]["params.width"] for t in done["trials"]) == [1, 2, 3, 4, 5, 6]
    assert done["status"] == "finished" and done["best"]["values"] == {"params.width": 1}
    assert done["best"]["last"] == 0.5 and done["best"]["best"] == 0.5
    listed = client.get("/api/v1/jobs", params={"sweep": sweep_id}).json()
    assert listed["total"] == 6 and {j["sweep_id"] for j in listed["items"]} == {sweep_id}


def test_a_sweep_is_cancelled_by_its_owner_or_an_admin_once(
    undriven: TestClient, engine: Engine, settings: Settings, add_worker: Callable[..., Any]
) -> None:
    client = undriven
    add_worker()
    sweep_id = client.post("/api/v1/sweeps", json=GOOD).json()["id"]
    Driver(engine, settings, CatalogCache()).drive()
    assert client.get("/api/v1/jobs", params={"sweep": sweep_id}).json()["total"] == 4
    r = client.post(f"/api/v1/sweeps/{sweep_id}/cancel")
    assert r.status_code == 202 and r.json()["status"] == "cancelled"
    assert r.json()["counts"]["cancelled"] == 4
    assert client.post(f"/api/v1/sweeps/{sweep_id}/cancel").status_code == 202
    assert client.get("/api/v1/sweeps/999").status_code == 404
    assert client.post("/api/v1/sweeps/999/cancel").status_code == 404


def test_a_sweep_whose_first_trials_all_fail_stops_and_cancels_the_rest(
    undriven: TestClient, engine: Engine, settings: Settings, add_worker: Callable[..., Any]
) -> None:
    add_worker()
    body = {**GOOD, "max_trials": 10, "max_parallel": 4}
    sweep_id = undriven.post("/api/v1/sweeps", json=body).json()["id"]
    driver = Driver(engine, settings, CatalogCache())
    driver.drive()
    failed = Outcome(JobStatus.failed, R.error, "builtins.RuntimeError: no")
    for _ in range(3):
        claimed = store.claim_job(engine, **WORKER)
        assert claimed is not None
        store.finish_attempt(engine, claimed.fence, failed)
    driver.drive()
    done = undriven.get(f"/api/v1/sweeps/{sweep_id}").json()
    assert done["status"] == "failed" and "first 3 trials failed" in done["reason"]["message"]
    assert done["counts"] == {
        "queued": 0, "running": 0, "succeeded": 0, "failed": 3, "cancelled": 1, "pruned": 0,
        "total": 4,
    }  # fmt: skip
    assert not driver.held


def test_a_pruned_trial_stops_as_a_cancel_and_one_that_trained_to_its_end_counts(
    undriven: TestClient, engine: Engine, settings: Settings, add_worker: Callable[..., Any]
) -> None:
    """ASHA prunes the trials that trail the first at epoch 1: the first one's stop ends
    cancelled with reason pruned; the second trains to its end before its stop lands (a
    late cancel), so it counts complete, as its job succeeded."""
    add_worker()
    body = {
        **GOOD,
        "parameters": {"params.width": {"type": "categorical", "values": [1, 2, 3]}},
        "search": "grid",
        "max_trials": None,
        "max_parallel": 1,
        "pruner": {"type": "asha", "min_resource": 1, "reduction_factor": 2},
        "job": {**TINY, "epochs": 4},  # epoch 1 is not its last: it may be pruned there
    }
    sweep_id = undriven.post("/api/v1/sweeps", json=body).json()["id"]
    driver = Driver(engine, settings, CatalogCache())

    def run_trial(loss: float, end: Outcome | None) -> int:
        """The one queued trial: claimed, its epoch 1 reported; ended if ``end``."""
        driver.drive()
        claimed = store.claim_job(engine, **WORKER)
        assert claimed is not None
        point = MetricPoint("val/loss", 1, 1, loss, time.time())
        assert store.report(engine, claimed.fence, metrics=[point])
        if end is not None:
            store.finish_attempt(engine, claimed.fence, end)
            return claimed.fence.job_id
        driver.drive()  # sees epoch 1: far behind the first, pruned
        job = undriven.get(f"/api/v1/jobs/{claimed.fence.job_id}").json()
        assert job["status"] == "cancelling" and job["reason"]["code"] == "pruned", job
        assert "pruned by the sweep's asha pruner at epoch 1" in job["reason"]["message"]
        return claimed.fence.job_id

    succeeded = Outcome(JobStatus.succeeded, R.succeeded, "trained")
    stopped = Outcome(JobStatus.cancelled, R.cancelled, "stopped")
    run_trial(0.1, succeeded)
    pruned = run_trial(5.0, None)
    with read_session(engine) as session:
        job = session.get(Job, pruned)
        assert job is not None and job.lease_token is not None
        held = store.Fence(pruned, job.attempt, job.lease_token)
    store.finish_attempt(engine, held, stopped)
    ended = undriven.get(f"/api/v1/jobs/{pruned}").json()
    assert ended["status"] == "cancelled" and ended["reason"]["code"] == "pruned"
    late = run_trial(6.0, None)
    with read_session(engine) as session:
        job = session.get(Job, late)
        assert job is not None and job.lease_token is not None
        held = store.Fence(late, job.attempt, job.lease_token)
    store.finish_attempt(engine, held, succeeded)
    driver.drive()
    done = undriven.get(f"/api/v1/sweeps/{sweep_id}").json()
    assert done["status"] == "finished"
    assert [(t["status"], t["pruned"]) for t in done["trials"]] == [
        ("succeeded", False),
        ("cancelled", True),
        ("succeeded", False),
    ]
    assert done["counts"]["pruned"] == 1 and done["counts"]["succeeded"] == 2
    assert "2 complete, 1 pruned" in done["reason"]["message"], done["reason"]


def test_a_random_sweep_taken_over_draws_what_one_driver_would_have(
    undriven: TestClient, engine: Engine, settings: Settings, add_worker: Callable[..., Any]
) -> None:
    """Each trial is drawn from its own seed: a study rebuilt by a second driver goes on
    with trial n's values, not the first trials' again."""
    add_worker()
    body = {**GOOD, "search": "random", "seed": 7, "max_trials": 6, "max_parallel": 2}
    quick = settings.model_copy(update={"sweep_lease_s": 1.0})

    def values(sweep_id: int) -> list[dict[str, Any]]:
        trials = undriven.get(f"/api/v1/sweeps/{sweep_id}").json()["trials"]
        return [t["values"] for t in trials]

    def run(take_over: bool) -> list[dict[str, Any]]:
        sweep_id = undriven.post("/api/v1/sweeps", json=body).json()["id"]
        drivers = [Driver(engine, quick, CatalogCache()) for _ in range(2)]
        drivers[0].drive()
        play_worker(engine, lambda _: 1.0)
        if take_over:  # the first driver stops; the second waits out its lease
            wait_for(lambda: (drivers[1].drive(), bool(drivers[1].held))[1], 5, "takeover")
        driver = drivers[1] if take_over else drivers[0]
        while undriven.get(f"/api/v1/sweeps/{sweep_id}").json()["status"] == "running":
            driver.drive()
            play_worker(engine, lambda _: 1.0)
        return values(sweep_id)

    alone, taken_over = run(False), run(True)
    assert taken_over == alone
    assert len({json.dumps(v, sort_keys=True) for v in alone}) == 6


def test_a_sweep_asks_only_for_what_its_owner_may_run(
    undriven: TestClient, engine: Engine, settings: Settings, add_worker: Callable[..., Any]
) -> None:
    add_worker(slots=4)
    assert undriven.post("/api/v1/users", json={"name": "bob"}).status_code == 201
    token = undriven.post("/api/v1/users/bob/tokens").json()["token"]
    bob = {"Authorization": f"Bearer {token}"}
    never_stopped = {"preemptible": {"type": "categorical", "values": [True, False]}}
    r = undriven.post("/api/v1/sweeps", json={**GOOD, "parameters": never_stopped}, headers=bob)
    assert r.status_code == 403, r.text
    assert undriven.patch("/api/v1/users/bob/quotas", json={"max_running_devices": 1}).is_success
    wide = {"devices": {"type": "categorical", "values": [1, 2]}}
    job = {**TINY, "strategy": "ddp"}
    r = undriven.post("/api/v1/sweeps", json={**GOOD, "job": job, "parameters": wide}, headers=bob)
    assert r.status_code == 422 and where(r.json()["detail"]) == ["parameters.devices"], r.text
    assert "would wait forever" in r.json()["detail"][0]["msg"]


def test_a_sweep_that_cannot_be_driven_fails_and_holds_back_no_other(
    undriven: TestClient, engine: Engine, settings: Settings, add_worker: Callable[..., Any]
) -> None:
    add_worker()
    broken = undriven.post("/api/v1/sweeps", json=GOOD).json()["id"]
    fine = undriven.post("/api/v1/sweeps", json=GOOD).json()["id"]
    # a space Optuna refuses, as one stored before the check at submit refused it
    tiny_steps = {"type": "float", "low": 1e-3, "high": 0.1, "step": 1e-32}
    with write_session(engine) as session:
        stored = session.get(Sweep, broken)
        assert stored is not None
        spec = {**stored.spec, "parameters": {"lr": tiny_steps}}
        session.exec(update(Sweep).where(col(Sweep.id) == broken).values(spec=spec))
    Driver(engine, settings, CatalogCache()).drive()
    failed = undriven.get(f"/api/v1/sweeps/{broken}").json()
    assert failed["status"] == "failed"
    assert failed["reason"]["message"].startswith("the sweep driver cannot run it: ")
    assert undriven.get("/api/v1/jobs", params={"sweep": fine}).json()["total"] == 4


def test_asha_taken_over_remembers_the_rungs_trials_passed(
    undriven: TestClient, engine: Engine, settings: Settings, add_worker: Callable[..., Any]
) -> None:
    """The rungs ASHA noted on finished trials are kept with them: a second driver
    prunes a trailing trial as the first would have."""
    add_worker()
    body = {
        **GOOD,
        "parameters": {"params.width": {"type": "categorical", "values": [1, 2, 3, 4, 5]}},
        "search": "grid",
        "max_trials": None,
        "max_parallel": 1,
        "pruner": {"type": "asha", "min_resource": 1, "reduction_factor": 2},
        "job": {**TINY, "epochs": 4},  # epoch 1 is not its last: it may be pruned there
    }
    assert undriven.post("/api/v1/sweeps", json=body).status_code == 201
    quick = settings.model_copy(update={"sweep_lease_s": 1.0})
    first, second = (Driver(engine, quick, CatalogCache()) for _ in range(2))
    for loss in (1.0, 2.0, 3.0, 4.0):  # each trial run one at a time, to its end
        first.drive()
        play_worker(engine, lambda _, loss=loss: loss)  # type: ignore[misc]
    first.drive()  # the last trial queued
    wait_for(lambda: (second.drive(), bool(second.held))[1], 5, "the takeover")
    claimed = store.claim_job(engine, **WORKER)
    assert claimed is not None
    point = MetricPoint("val/loss", 1, 1, 9.0, time.time())
    assert store.report(engine, claimed.fence, metrics=[point])
    second.drive()
    job = undriven.get(f"/api/v1/jobs/{claimed.fence.job_id}").json()
    assert job["status"] == "cancelling" and job["reason"]["code"] == "pruned", job


def test_a_trial_is_never_pruned_at_its_last_epoch(
    undriven: TestClient, engine: Engine, settings: Settings, add_worker: Callable[..., Any]
) -> None:
    """Nothing is left to save there, and its whole result would be lost to the ranking."""
    add_worker()
    body = {
        **GOOD,
        "parameters": {"params.width": {"type": "categorical", "values": [1, 2]}},
        "search": "grid",
        "max_trials": None,
        "max_parallel": 1,
        "pruner": {"type": "asha", "min_resource": 1, "reduction_factor": 2},
        "job": {**TINY, "epochs": 1},
    }
    assert undriven.post("/api/v1/sweeps", json=body).status_code == 201
    driver = Driver(engine, settings, CatalogCache())
    driver.drive()
    play_worker(engine, lambda _: 1.0)
    driver.drive()
    claimed = store.claim_job(engine, **WORKER)
    assert claimed is not None
    assert store.report(engine, claimed.fence, metrics=[MetricPoint("val/loss", 1, 1, 9.0, 0.0)])
    driver.drive()
    assert undriven.get(f"/api/v1/jobs/{claimed.fence.job_id}").json()["status"] == "running"
