"""Sweeps end to end: a real server driving them, real workers running their trials.

The store's part (the fenced lease, a trial's job and row in one transaction) matters on
both databases, so the grid and the restart run on both; pruning, cancel, fair share and
a script's placeholders do not depend on the database and run on SQLite.
"""

from __future__ import annotations

import json
import os
import signal
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import one_database
from tests.scripts import put_package
from tests.stack import Stack, wait_for

pytestmark = pytest.mark.slow

TINY = {"recipe": "tiny", "accelerator": "cpu", "params": {"samples": 256}}


def start_sweep(http: httpx.Client, **body: Any) -> dict[str, Any]:
    r = http.post("/sweeps", json={"metric": "val/loss", "mode": "min", **body})
    assert r.status_code == 201, r.text
    return r.json()  # type: ignore[no-any-return]


def wait_sweep(stack: Stack, sweep_id: int, timeout: float = 120) -> dict[str, Any]:
    """The sweep once it is no longer running."""
    wait_for(
        lambda: stack.http.get(f"/sweeps/{sweep_id}").json()["status"] != "running",
        timeout,
        f"sweep {sweep_id} to end",
    )
    return stack.http.get(f"/sweeps/{sweep_id}").json()  # type: ignore[no-any-return]


def trial_jobs(stack: Stack, sweep_id: int) -> list[dict[str, Any]]:
    listed = stack.http.get("/jobs", params={"sweep": sweep_id, "limit": 500}).json()
    assert listed["total"] == len(listed["items"])
    return listed["items"]  # type: ignore[no-any-return]


def most_unfinished_at_once(jobs: list[dict[str, Any]]) -> int:
    """The most of these jobs that were submitted and not yet ended at one moment."""
    spans = [
        (datetime.fromisoformat(j["created_at"]), datetime.fromisoformat(j["finished_at"]))
        for j in jobs
    ]
    return max(sum(1 for a, b in spans if a <= start < b) for start, _ in spans)


def test_a_grid_runs_every_point_once_and_tpe_keeps_its_bounds(stack: Stack) -> None:
    stack.start_worker()
    grid = start_sweep(
        stack.http,
        name="grid",
        job={**TINY, "epochs": 2},
        parameters={
            "params.width": {"type": "categorical", "values": [4, 16]},
            "lr": {"type": "float", "low": 0.01, "high": 0.05, "step": 0.04},
        },
        search="grid",
        max_parallel=2,
    )
    tpe = start_sweep(
        stack.http,
        name="tpe",
        job={**TINY, "epochs": 1},
        parameters={"lr": {"type": "float", "low": 1e-3, "high": 0.1, "log": True}},
        search="tpe",
        seed=3,
        max_trials=5,
        max_parallel=1,
    )
    done = wait_sweep(stack, grid["id"])
    assert done["status"] == "finished", done["reason"]
    points = sorted((t["values"]["params.width"], t["values"]["lr"]) for t in done["trials"])
    assert points == [(4, 0.01), (4, 0.05), (16, 0.01), (16, 0.05)]
    assert [t["number"] for t in done["trials"]] == [0, 1, 2, 3]
    jobs = {j["id"]: j for j in trial_jobs(stack, grid["id"])}
    assert set(jobs) == {t["job_id"] for t in done["trials"]} and len(jobs) == 4
    for trial in done["trials"]:  # each job trains its own point
        job = jobs[trial["job_id"]]
        assert job["sweep_id"] == grid["id"] and job["status"] == "succeeded"
        assert (job["params"]["width"], job["lr"]) == (
            trial["values"]["params.width"],
            trial["values"]["lr"],
        )
        points_of = stack.http.get(f"/jobs/{job['id']}/metrics", params={"name": "val/loss"})
        assert trial["last"] == points_of.json()[-1]["value"]
    best = min(done["trials"], key=lambda t: t["last"])
    assert done["best"]["number"] == best["number"]
    assert done["counts"] == {
        "queued": 0, "running": 0, "succeeded": 4, "failed": 0, "cancelled": 0, "pruned": 0,
        "total": 4,
    }  # fmt: skip
    assert most_unfinished_at_once(list(jobs.values())) <= 2

    done = wait_sweep(stack, tpe["id"])
    assert done["status"] == "finished", done["reason"]
    assert len(done["trials"]) == 5 and len(trial_jobs(stack, tpe["id"])) == 5
    assert all(1e-3 <= t["values"]["lr"] <= 0.1 for t in done["trials"])
    assert most_unfinished_at_once(trial_jobs(stack, tpe["id"])) == 1
    listed = stack.http.get("/sweeps").json()
    assert [s["id"] for s in listed["items"]] == [tpe["id"], grid["id"]]
    assert listed["items"][0]["trials"] == [] and listed["items"][0]["best"] is not None


@one_database("sqlite")
def test_asha_prunes_trials_that_trail_and_keeps_the_best(stack: Stack) -> None:
    """One learning rate trains, the others barely move: run one at a time, the trials
    that trail the good one at a rung are stopped there, pruned; the good one never is."""
    stack.start_worker()
    sweep = start_sweep(
        stack.http,
        job={**TINY, "epochs": 4, "params": {"samples": 256, "sleep_per_step_s": 0.25}},
        parameters={"lr": {"type": "categorical", "values": [0.05, 1e-5, 2e-5, 3e-5, 4e-5]}},
        search="grid",
        seed=1,
        max_parallel=1,
        pruner={"type": "asha", "min_resource": 1, "reduction_factor": 2},
    )
    done = wait_sweep(stack, sweep["id"], timeout=180)
    assert done["status"] == "finished", done["reason"]
    trials = done["trials"]
    good = next(t for t in trials if t["values"]["lr"] == 0.05)
    assert done["best"]["number"] == good["number"] and good["status"] == "succeeded"
    assert not good["pruned"]
    pruned = [t for t in trials if t["pruned"]]
    assert pruned, [(t["values"], t["status"], t["last"]) for t in trials]
    for trial in pruned:
        assert trial["values"]["lr"] != 0.05 and trial["status"] == "cancelled", trial
        assert trial["reason"]["code"] == "pruned"
        assert "pruned by the sweep's asha pruner at epoch" in trial["reason"]["message"]
        job = stack.job(trial["job_id"])
        assert job["reason"]["code"] == "pruned"
        assert job["progress"]["epoch"] < 4  # stopped before its last epoch
    assert done["counts"]["pruned"] == len(pruned)
    # a pruned trial is none of the other ends in a listing
    cancelled = stack.http.get("/jobs", params={"sweep": sweep["id"], "status": "cancelled"})
    assert {j["reason"]["code"] for j in cancelled.json()["items"]} == {"pruned"}


@one_database("sqlite")
def test_cancel_ends_every_trial_and_leaves_no_process(stack: Stack) -> None:
    stack.start_worker()
    sweep = start_sweep(
        stack.http,
        job={**TINY, "epochs": 50, "params": {"samples": 256, "sleep_per_step_s": 0.2}},
        parameters={"lr": {"type": "float", "low": 1e-3, "high": 0.1}},
        max_trials=6,
        max_parallel=3,
    )

    def running() -> list[dict[str, Any]]:
        return [j for j in trial_jobs(stack, sweep["id"]) if j["status"] == "running"]

    wait_for(lambda: len(running()) == 2, 60, "two trials running")  # two CPU slots
    pgids = [stack.runner_pgid(j["id"]) for j in running()]
    r = stack.http.post(f"/sweeps/{sweep['id']}/cancel")
    assert r.status_code == 202 and r.json()["status"] == "cancelled"
    wait_for(
        lambda: all(j["status"] == "cancelled" for j in trial_jobs(stack, sweep["id"])),
        60,
        "every trial cancelled",
    )
    for pgid in pgids:
        with pytest.raises(ProcessLookupError):
            os.killpg(pgid, 0)
    done = stack.http.get(f"/sweeps/{sweep['id']}").json()
    assert done["status"] == "cancelled" and done["counts"]["cancelled"] == 3
    assert len(done["trials"]) == 3  # none started after the cancel
    again = stack.http.post(f"/sweeps/{sweep['id']}/cancel")
    assert again.status_code == 202  # idempotent


def test_a_killed_api_and_worker_lose_no_trial_and_count_none_twice(
    stack: Stack, tmp_path: Path
) -> None:
    """The API process (the sweep's driver) and the worker are killed with SIGKILL while
    trials run; restarted, the sweep goes on from the rows: each grid point runs once."""
    stack.env["TRAINYARD_SWEEP_LEASE_S"] = "3"
    server = stack.procs[0]
    stack.procs.remove(server)
    server.send_signal(signal.SIGTERM)
    server.wait(timeout=30)
    api = stack.start("serve", log_name="serve-2")  # with the short lease
    wait_for(lambda: _healthy(stack), 30, "the API back")
    worker = stack.start_worker()
    sweep = start_sweep(
        stack.http,
        job={**TINY, "epochs": 3, "params": {"samples": 256, "sleep_per_step_s": 0.1}},
        parameters={"params.width": {"type": "categorical", "values": [2, 4, 8, 16]}},
        search="grid",
        max_parallel=2,
    )

    def running() -> int:
        return sum(j["status"] == "running" for j in trial_jobs(stack, sweep["id"]))

    wait_for(lambda: running() == 2, 60, "two trials running")
    api.kill()
    worker.kill()
    api.wait(timeout=10)
    worker.wait(timeout=10)
    stack.start("serve", log_name="serve-3")
    wait_for(lambda: _healthy(stack), 30, "the API back")
    stack.start_worker()
    done = wait_sweep(stack, sweep["id"], timeout=180)
    assert done["status"] == "finished", done["reason"]
    assert sorted(t["values"]["params.width"] for t in done["trials"]) == [2, 4, 8, 16]
    assert [t["number"] for t in done["trials"]] == [0, 1, 2, 3]
    jobs = trial_jobs(stack, sweep["id"])
    assert len(jobs) == 4 and all(j["status"] == "succeeded" for j in jobs)
    assert done["counts"]["succeeded"] == 4 and done["counts"]["total"] == 4


def _healthy(stack: Stack) -> bool:
    try:
        return httpx.get(stack.url + "/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


@one_database("sqlite")
def test_a_sweep_does_not_hold_back_a_colleagues_job(stack: Stack) -> None:
    """Alice's sweep queues four trials on a one-slot worker; Bob's one job, submitted
    after them, runs as soon as her first trial ends: fair share, not arrival order."""
    tokens = {}
    for name in ("alice", "bob"):
        assert stack.http.post("/users", json={"name": name}).status_code == 201
        tokens[name] = stack.http.post(f"/users/{name}/tokens").json()["token"]
    stack.start_worker(cpu_slots=1)
    alice = httpx.Client(base_url=stack.http.base_url, headers=_bearer(tokens["alice"]))
    bob = httpx.Client(base_url=stack.http.base_url, headers=_bearer(tokens["bob"]))
    with alice, bob:
        sweep = start_sweep(
            alice,
            job={**TINY, "epochs": 2, "params": {"samples": 256, "sleep_per_step_s": 0.1}},
            parameters={"params.width": {"type": "categorical", "values": [2, 4, 8, 16]}},
            search="grid",
            max_parallel=4,
        )
        wait_for(
            lambda: [j["status"] for j in trial_jobs(stack, sweep["id"])].count("queued") == 3,
            60,
            "one trial running, three queued",
        )
        r = bob.post("/jobs", json={**TINY, "epochs": 1})
        assert r.status_code == 201, r.text
        theirs = r.json()["id"]
        done = wait_sweep(stack, sweep["id"], timeout=180)
    assert done["status"] == "finished" and {t["values"]["params.width"] for t in done["trials"]}
    assert all(j["owner"] == "alice" for j in trial_jobs(stack, sweep["id"]))
    bobs = stack.job(theirs)
    starts = sorted(j["started_at"] for j in trial_jobs(stack, sweep["id"]))
    assert bobs["status"] == "succeeded"
    assert starts[0] < bobs["started_at"] < starts[1], (bobs["started_at"], starts)


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


SCRIPT = """\
import json, os, sys

lr = float(sys.argv[sys.argv.index("--lr") + 1])
params = json.loads(os.environ["TRAINYARD_PARAMS"])
print("params", json.dumps(params, sort_keys=True), flush=True)
with open(os.environ["TRAINYARD_METRICS_FILE"], "a") as out:
    for epoch in (1, 2):
        score = (lr - 0.3) ** 2 / epoch
        out.write(json.dumps({"step": epoch, "epoch": epoch, "val/score": score}) + "\\n")
"""


@one_database("sqlite")
def test_a_script_sweep_reads_its_values_in_its_arguments_and_params(
    stack: Stack, tmp_path: Path
) -> None:
    package = tmp_path / "sweepy"
    package.mkdir()
    (package / "train.py").write_text(SCRIPT)
    stack.start_worker()
    sweep = start_sweep(
        stack.http,
        job={
            "code": put_package(stack.http, package, tmp_path),
            "entrypoint": ["python", "train.py", "--lr", "{lr}"],
            "accelerator": "cpu",
        },
        parameters={
            "lr": {"type": "categorical", "values": [0.1, 0.3, 0.5]},
            "params.tag": {"type": "categorical", "values": ["x"]},
        },
        search="grid",
        metric="val/score",
        max_parallel=2,
    )
    done = wait_sweep(stack, sweep["id"])
    assert done["status"] == "finished", done["reason"]
    assert done["best"]["values"]["lr"] == 0.3 and done["best"]["last"] == 0.0
    for trial in done["trials"]:
        lr = trial["values"]["lr"]
        assert trial["last"] == pytest.approx((lr - 0.3) ** 2 / 2)
        job = stack.job(trial["job_id"])
        assert job["entrypoint"] == ["python", "train.py", "--lr", json.dumps(lr)]
        logs = [x["text"] for x in stack.http.get(f"/jobs/{job['id']}/logs").json()]
        want = json.dumps({"lr": lr, "tag": "x"}, sort_keys=True)
        assert any(line.endswith(f"params {want}") for line in logs), logs
