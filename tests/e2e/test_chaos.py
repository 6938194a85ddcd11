"""Chaos: kill, stop and starve real workers and ranks; the job system must not lose work."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import sqlite3
import subprocess
import tempfile
import time
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load

from tests.e2e.conftest import one_database
from tests.stack import RECIPES_DIR, REPO, Stack, running_stack, wait_for
from workers.jobfiles import MODEL_FILE
from workers.procfs import group_members
from workers.ranks import strategies
from workers.ranks.training import RunSpec

pytestmark = pytest.mark.slow
# What happens to a job's processes (a killed rank, a timeout, a stall): the worker's
# doing, one database is enough; the store's side of each is tested on both elsewhere.
PROCESSES_ONLY = one_database("sqlite")

# 1024 samples / batch 64 = 16 steps an epoch; each step sleeps, so the run lasts a while.
SLOW = {"recipe": "tiny", "strategy": "ddp", "devices": 2, "accelerator": "cpu", "batch_size": 64}
SLOW_PARAMS = {"samples": 1024, "sleep_per_step_s": 0.01}


def rank_pids(pgid: int) -> list[int]:
    """The DDP rank processes of a runner's group (not the runner, not mp's resource tracker)."""
    ranks = []
    for pid in group_members(pgid):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if pid != pgid and b"resource_tracker" not in cmdline:
            ranks.append(pid)
    return ranks


def stop_outside_a_transaction(stack: Stack, proc: subprocess.Popen[bytes]) -> None:
    """SIGSTOP ``proc`` at a moment it does not hold SQLite's write lock.

    On SQLite a process stopped inside a write transaction keeps the one database lock:
    every other writer waits for it (PostgreSQL has no such lock: its locks are per row). That is a
    limit of the database, not the scenario under test, so the test avoids it.
    """
    if not stack.database_url.startswith("sqlite"):
        proc.send_signal(signal.SIGSTOP)  # row locks: a stopped process blocks no one else
        return
    path = stack.database_url.removeprefix("sqlite:///")
    for _ in range(100):
        proc.send_signal(signal.SIGSTOP)
        with contextlib.closing(sqlite3.connect(path)) as conn:
            conn.execute("PRAGMA busy_timeout = 200")
            try:
                conn.execute("BEGIN IMMEDIATE")
                conn.rollback()
                return
            except sqlite3.OperationalError:  # it (or its runner) holds the lock: go on
                proc.send_signal(signal.SIGCONT)
        time.sleep(0.05)
    raise AssertionError("could not stop the worker outside a write transaction")


def reference_weights(stack: Stack, job_id: int) -> dict[str, torch.Tensor]:
    """The job's resolved spec trained in one go, here, without interruption."""
    spec = stack.http.get(f"/jobs/{job_id}/artifacts/spec.json").json()
    names = {f.name for f in fields(RunSpec)} - {"job_dir", "recipes_dir", "package", "attempt"}
    params = {**spec["params"], "sleep_per_step_s": 0.0}  # the same math, without the wait
    return _trained(json.dumps({**{k: spec[k] for k in names}, "params": params}, sort_keys=True))


@functools.cache  # the same spec trains to the same weights: once per session (~3 s each)
def _trained(spec_json: str) -> dict[str, torch.Tensor]:
    with tempfile.TemporaryDirectory() as job_dir:
        run = RunSpec(**json.loads(spec_json), job_dir=job_dir, recipes_dir=str(RECIPES_DIR))
        strategies.run(run)
        return load((Path(job_dir) / MODEL_FILE).read_bytes())


def job_weights(stack: Stack, job_id: int) -> dict[str, torch.Tensor]:
    return load(stack.http.get(f"/jobs/{job_id}/artifacts/{MODEL_FILE}").content)


def assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-6, msg=k)


def started_lines(stack: Stack, job_id: int) -> list[str]:
    logs = stack.http.get(f"/jobs/{job_id}/logs", params={"limit": 10_000}).json()
    return [x["text"] for x in logs if x["stream"] == "system" and " started on " in x["text"]]


@pytest.mark.parametrize(("sig", "attempt"), [(signal.SIGKILL, 2), (signal.SIGTERM, 1)])
def test_worker_stopped_mid_epoch_resumes_with_the_same_weights(
    stack: Stack, sig: signal.Signals, attempt: int
) -> None:
    """kill -9: the restarted worker kills the leftovers and retries from the checkpoint.
    SIGTERM: the job checkpoints where it is and goes back to the queue, attempt unspent."""
    worker = stack.start_worker(lease_s=60)  # recovery by restart, not by lease expiry
    job = stack.submit(**SLOW, epochs=12, params=SLOW_PARAMS)
    wait_for(lambda: (stack.job(job["id"])["progress"] or {}).get("epoch", 0) >= 3, 60, "epoch 3")
    pgid = stack.runner_pgid(job["id"])
    worker.send_signal(sig)
    assert worker.wait(timeout=60) in (0, -signal.SIGKILL)
    if sig == signal.SIGTERM:
        handed_back = stack.job(job["id"])
        assert handed_back["status"] == "queued" and handed_back["attempt"] == 1
        assert handed_back["reason"]["code"] == "worker_shutdown"
        assert group_members(pgid) == []  # the worker left nothing behind
    stack.start_worker()
    done = stack.wait_status(job["id"], {"succeeded", "failed"})
    assert done["status"] == "succeeded" and done["attempt"] == attempt, done
    assert group_members(pgid) == []  # nothing of the first run survived
    texts = [x["text"] for x in stack.http.get(f"/jobs/{job['id']}/logs").json()]
    assert any("resuming from epoch-" in t for t in texts)
    val = [
        m["epoch"]
        for m in stack.http.get(f"/jobs/{job['id']}/metrics", params={"name": "val/loss"}).json()
    ]
    assert val == list(range(1, 13))  # each epoch once: a resumed run adds no duplicates
    assert_same_weights(job_weights(stack, job["id"]), reference_weights(stack, job["id"]))


@PROCESSES_ONLY
def test_killed_rank_fails_the_attempt_fast_and_the_retry_succeeds(stack: Stack) -> None:
    stack.start_worker()
    job = stack.submit(**SLOW, epochs=8, params=SLOW_PARAMS, max_attempts=2)
    wait_for(lambda: (stack.job(job["id"])["progress"] or {}).get("epoch", 0) >= 2, 60, "epoch 2")
    pgid = stack.runner_pgid(job["id"])
    ranks = wait_for(lambda: len(r := rank_pids(pgid)) == 2 and r, 10, "two ranks")
    os.kill(ranks[1], signal.SIGKILL)
    wait_for(lambda: stack.job(job["id"])["attempt"] == 2, 60, "the attempt to end and retry")
    assert group_members(pgid) == []
    done = stack.wait_status(job["id"], {"succeeded", "failed"})
    assert done["status"] == "succeeded" and done["attempt"] == 2
    texts = [x["text"] for x in stack.http.get(f"/jobs/{job['id']}/logs").json()]
    assert any("attempt 1 ended" in t and "SIGKILL" in t for t in texts), texts[-20:]


def test_worker_stopped_past_its_lease_loses_the_job_to_another(stack: Stack) -> None:
    fast = {"lease_s": 3, "heartbeat_interval_s": 0.5}
    a = stack.start_worker("a", **fast)
    job = stack.submit(**SLOW, epochs=30, params=SLOW_PARAMS)
    wait_for(lambda: stack.job(job["id"])["progress"], 60, "training on a")
    old_pgid = stack.runner_pgid(job["id"])
    stop_outside_a_transaction(stack, a)
    try:
        stack.start_worker("b", **fast)
        taken = wait_for(
            lambda: (
                (j := stack.job(job["id"]))["worker_id"] == "b" and j["status"] == "running" and j
            ),
            60,
            "worker b to take the job",
        )
        assert taken["attempt"] == 2
        # a's runner learns from its refused writes that the job is gone, and stops itself
        wait_for(lambda: group_members(old_pgid) == [], 30, "a's runner to stop")
    finally:
        a.send_signal(signal.SIGCONT)
    done = stack.wait_status(job["id"], {"succeeded", "failed"})
    assert done["status"] == "succeeded" and done["worker_id"] == "b" and done["attempt"] == 2
    a_log = stack.tmp / "worker-a.log"
    wait_for(lambda: "lease lost" in a_log.read_text(), 30, "worker a to notice its lost lease")
    assert stack.job(job["id"])["status"] == "succeeded"  # a changed nothing after it woke


@PROCESSES_ONLY
def test_timeout_ends_the_attempt_and_is_not_retried(stack: Stack) -> None:
    stack.start_worker(kill_grace_s=2)
    job = stack.submit(**SLOW, epochs=1000, params=SLOW_PARAMS, timeout_s=4, max_attempts=3)
    wait_for(lambda: stack.job(job["id"])["progress"], 60, "training to start")
    pgid = stack.runner_pgid(job["id"])
    done = stack.wait_status(job["id"], {"succeeded", "failed"}, 60)
    assert done["status"] == "failed" and done["attempt"] == 1
    assert done["reason"]["code"] == "timeout"
    assert group_members(pgid) == []


def test_three_workers_run_each_of_40_jobs_exactly_once(stack: Stack) -> None:
    for worker in "abc":  # all poll before the first job arrives: they compete for all
        stack.start_worker(worker, cpu_slots=1)
    for worker in "abc":  # and all can claim (a worker claims nothing before it is warm)
        log = stack.tmp / f"worker-{worker}.log"
        wait_for(lambda log=log: "zygote warm" in log.read_text(), 120, f"{worker} warm")
    ids = [
        stack.submit(recipe="tiny", epochs=1, seed=i, params={"samples": 64})["id"]
        for i in range(40)
    ]
    for job_id in ids:
        stack.wait_status(job_id, {"succeeded", "failed"}, 300)
    jobs = [stack.job(i) for i in ids]
    assert [j["status"] for j in jobs] == ["succeeded"] * 40
    assert [j["attempt"] for j in jobs] == [1] * 40
    assert [len(started_lines(stack, i)) for i in ids] == [1] * 40
    assert {j["worker_id"] for j in jobs} == {"a", "b", "c"}  # each took a share


def test_small_jobs_share_the_box_and_a_big_one_waits_with_a_reason(stack: Stack) -> None:
    small: dict[str, Any] = {"recipe": "tiny", "devices": 1, "epochs": 12, "params": SLOW_PARAMS}
    one, two = stack.submit(**small), stack.submit(**small)
    big = stack.submit(recipe="tiny", devices=2, epochs=1)
    stack.start_worker()

    def both_running() -> list[dict[str, Any]] | None:
        jobs = [stack.job(one["id"]), stack.job(two["id"])]
        return (
            jobs if all(j["status"] == "running" and j["assigned_devices"] for j in jobs) else None
        )

    both = wait_for(both_running, 60, "both one-device jobs running at once")
    assert sorted(d for j in both for d in j["assigned_devices"]) == [0, 1]
    waiting = stack.job(big["id"])
    assert waiting["status"] == "queued" and waiting["queue_position"] == 1
    assert waiting["reason"] == {
        "code": "queued",
        "message": "waiting for 2 free device(s); next in line",
    }
    done = [stack.wait_status(j["id"], {"succeeded", "failed"}) for j in (one, two, big)]
    assert [d["status"] for d in done] == ["succeeded"] * 3
    assert done[2]["started_at"] >= max(done[0]["finished_at"], done[1]["finished_at"])


@PROCESSES_ONLY
def test_an_attempt_whose_step_stops_moving_is_ended(stack: Stack) -> None:
    stack.start_worker(stall_timeout_s=3, kill_grace_s=1)
    hung = {"samples": 1024, "sleep_per_step_s": 9.0}  # one step outlasts the watchdog
    job = stack.submit(recipe="tiny", devices=1, epochs=1, params=hung, max_attempts=1)
    wait_for(lambda: stack.job(job["id"])["status"] == "running", 30, "the job to start")
    pgid = stack.runner_pgid(job["id"])
    done = stack.wait_status(job["id"], {"succeeded", "failed"}, 60)
    assert done["status"] == "failed" and done["reason"]["code"] == "stalled"
    assert group_members(pgid) == []


def test_a_zygote_that_cannot_get_warm_is_given_up_and_jobs_start_cold(tmp_path: Path) -> None:
    # Every zygote this worker starts dies at once (a broken install, say): the worker
    # must not wait for one forever, nor restart it forever.
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import os\n"
        "if b'workers.zygote' in open('/proc/self/cmdline', 'rb').read():\n"
        "    os._exit(7)\n"
    )
    (tmp_path / "stack").mkdir()
    with running_stack(tmp_path / "stack") as stack:
        stack.start_worker("cold", env={"PYTHONPATH": f"{site}:{REPO}"})
        job = stack.submit(recipe="tiny", epochs=1, params={"sleep_per_step_s": 0.01})
        done = stack.wait_status(job["id"], {"succeeded", "failed"})
        assert (done["status"], done["attempt"]) == ("succeeded", 1), done
        log = (stack.tmp / "worker-cold.log").read_text()
        assert log.count("zygote exited with 7") == 3, log
        assert "zygote died 3 times before warm; starting runners as fresh interpreters" in log
