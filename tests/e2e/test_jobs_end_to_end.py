"""Submit over HTTP to a real server; a real worker trains with real gloo DDP."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load

from tests.e2e.conftest import one_database
from tests.stack import Stack, wait_for
from workers.procfs import group_members
from workers.ranks.training import evaluate
from workers.recipes import load_recipes

pytestmark = pytest.mark.slow


def test_ddp_job_runs_reports_and_produces_a_loadable_model(stack: Stack) -> None:
    stack.start_worker()
    params = {"train_samples": 16384, "hidden": 32}
    job = stack.submit(
        recipe="mlp-regression",
        strategy="ddp",
        devices=2,
        accelerator="cpu",
        epochs=4,
        params=params,
    )
    live = wait_for(
        lambda: (j := stack.job(job["id"]))["status"] == "running" and j["progress"] and j,
        60,
        "live progress",
    )
    assert live["assigned_devices"] == [0, 1] and live["worker_id"] == "e2e"
    assert set(live["progress"]) == {
        "epoch",
        "epochs",
        "step",
        "total_steps",
        "loss",
        "samples_per_s",
        "eta_s",
    }
    assert live["progress"]["total_steps"] == 4 * 16384 // 64
    done = stack.wait_status(job["id"], {"succeeded", "failed"})
    assert done["status"] == "succeeded", done
    assert done["progress"]["step"] == done["progress"]["total_steps"]

    metrics = stack.http.get(f"/jobs/{job['id']}/metrics").json()
    names = {m["name"] for m in metrics}
    assert {
        "train/loss",
        "train/epoch_loss",
        "val/loss",
        "train/samples_per_s",
        "train/lr",
    } <= names
    val = [m for m in metrics if m["name"] == "val/loss"]
    assert [m["epoch"] for m in val] == [1, 2, 3, 4]
    assert val[-1]["value"] < val[0]["value"]  # it learned

    texts = [line["text"] for line in stack.http.get(f"/jobs/{job['id']}/logs").json()]
    assert any(t.startswith("[rank 0] ") for t in texts) and any(
        t.startswith("[rank 1] ") for t in texts
    )
    assert any("attempt 1 started on e2e" in t for t in texts)

    names = [a["name"] for a in stack.http.get(f"/jobs/{job['id']}/artifacts").json()]
    assert "model.safetensors" in names and "spec.json" in names
    spec = stack.http.get(f"/jobs/{job['id']}/artifacts/spec.json").json()
    assert spec["strategy"] == "ddp" and spec["params"]["hidden"] == 32
    env = done["environment"]
    assert env == spec["environment"]
    assert env["spec"]["seed"] == env["seed"] == 0 and env["worker_id"] == "e2e"
    assert env["torch"].startswith("2.13") and env["python"] and env["hostname"]
    assert len(env["recipe_source_sha256"]) == len(env["packages_sha256"]) == 64
    assert env["cuda"] is None or isinstance(env["cuda"], str)  # the CPU build has none
    blob = stack.http.get(f"/jobs/{job['id']}/artifacts/model.safetensors").content
    recipe = load_recipes()["mlp-regression"]
    p = recipe.params.model_validate(params)
    model = recipe.build_model(p)
    model.load_state_dict(load(blob))
    _, val_set = recipe.build_datasets(p, 0)
    reproduced = evaluate(recipe, model, val_set, torch.device("cpu"))["val/loss"]
    # Seen once in a full run (1.4e-4 apart; 0 in every rerun): say which attempt it was
    # and what the job logged, so that a recurrence can be told apart from noise.
    assert reproduced == pytest.approx(done["result"]["val/loss"], rel=1e-6), (
        done["attempt"],
        texts[-12:],
    )


@one_database("postgresql")  # processes; the cancel itself is tested on both
def test_cancel_running_ddp_job_stops_every_process(stack: Stack) -> None:
    stack.start_worker()
    job = stack.submit(
        recipe="mlp-regression",
        strategy="ddp",
        devices=2,
        accelerator="cpu",
        epochs=1000,
        params={"train_samples": 16384},
    )
    wait_for(lambda: stack.job(job["id"])["progress"], 60, "training to start")
    pgid = stack.runner_pgid(job["id"])
    assert len(group_members(pgid)) >= 3  # runner + two ranks
    r = stack.http.post(f"/jobs/{job['id']}/cancel")
    assert r.status_code == 202 and r.json()["status"] == "cancelling"
    done = stack.wait_status(job["id"], {"cancelled"}, 60)
    assert group_members(pgid) == []  # nothing of the job is left when it says cancelled
    assert done["reason"]["code"] == "cancelled"
    assert stack.http.post(f"/jobs/{job['id']}/cancel").status_code == 202  # harmless again
    # the devices are free again: the next job runs
    nxt = stack.submit(recipe="tiny", devices=2, epochs=1)
    assert stack.wait_status(nxt["id"], {"succeeded", "failed"})["status"] == "succeeded"


@one_database("sqlite")  # the runner's report; the store's failure path is tested on both
def test_failing_job_ends_failed_with_its_error_and_last_lines(stack: Stack) -> None:
    """The recipe raises on every attempt: retried once, as retries_on_error asks, though
    attempts are left (the same code fails again)."""
    stack.start_worker()
    spec = {"max_attempts": 3, "retries_on_error": 1, "devices": 2, "epochs": 1}
    job = stack.submit(recipe="tiny", params={"fail": True}, **spec)
    done = stack.wait_status(job["id"], {"succeeded", "failed"})
    assert done["status"] == "failed" and done["attempt"] == 2
    assert done["reason"]["code"] == "error"
    said = done["reason"]["message"]
    assert said.startswith("builtins.RuntimeError: tiny recipe failed on purpose (rank 0 "), said
    assert said.endswith(") (the job's own error, 2 times; retries_on_error is 1)"), said
    assert done["error"]["type"] == "builtins.RuntimeError"
    assert done["error"]["message"] == "tiny recipe failed on purpose"
    assert any("RuntimeError" in line for line in done["error"]["traceback"])
    texts = [line["text"] for line in stack.http.get(f"/jobs/{job['id']}/logs").json()]
    assert sum("about to fail" in t for t in texts) >= 2  # printed by rank 0 and 1, each attempt
    assert any("[rank 1] last words on stderr" in t for t in texts)
    assert any("attempt 2 ended" in t for t in texts)


def test_drain_worker_runs_the_queue_then_exits(stack: Stack, tmp_path: Path) -> None:
    ids = [stack.submit(recipe="tiny", epochs=2, seed=i)["id"] for i in range(3)]
    worker = stack.start("worker", "--drain", "--worker-id", "drainer", log_name="drain")
    assert worker.wait(timeout=120) == 0
    assert [stack.job(i)["status"] for i in ids] == ["succeeded"] * 3
