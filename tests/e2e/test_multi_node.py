"""One job across boxes, on one machine: two real workers with their own WORKER_ID, data
folder and one CPU slot each (two "boxes"), a shared folder, a real PostgreSQL, ranks on
loopback with gloo through torch's elastic launch and c10d rendezvous."""

from __future__ import annotations

import io
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load

from tests.e2e.conftest import one_database
from tests.e2e.test_chaos import _trained, assert_same_weights
from tests.e2e.test_cli import cli
from tests.e2e.test_script_jobs import by_hand, submit_example
from tests.stack import Stack, wait_for
from workers.jobfiles import MODEL_FILE
from workers.procfs import group_members

# Across boxes is PostgreSQL's only (the API refuses it on SQLite).
pytestmark = [pytest.mark.slow, one_database("postgresql")]

LEASE_S = 4  # how soon a silent node counts as lost (the default is 15 s)
SPEC: dict[str, Any] = {
    "recipe": "tiny",
    "strategy": "ddp",
    "accelerator": "cpu",
    "batch_size": 64,
    "epochs": 3,
    "seed": 11,
    "params": {"samples": 512},
}


def start_box(
    stack: Stack, name: str, *, own_data_dir: bool = True, **settings: object
) -> subprocess.Popen[bytes]:
    """A worker as if on a box of its own: one CPU slot, its own data folder (or the
    stack's, as boxes that mount one DATA_DIR share it), and the folder every box shares
    for a job across boxes' checkpoints."""
    defaults: dict[str, object] = {"cpu_slots": 1, "lease_s": LEASE_S, "gang_timeout_s": 30}
    return stack.start_worker(
        name,
        env={"TRAINYARD_DATA_DIR": str(stack.tmp / name)} if own_data_dir else {},
        shared_dir=stack.tmp / "shared",
        **{**defaults, **settings},
    )


def model_of(stack: Stack, job_id: int) -> dict[str, torch.Tensor]:
    """The final weights, on the box whose node had global rank 0."""
    [path] = list(stack.tmp.glob(f"box*/jobs/{job_id}/{MODEL_FILE}"))
    return load(path.read_bytes())


def reference(**changes: Any) -> dict[str, torch.Tensor]:
    """The spec trained here in one process group, as one box would (no interruption)."""
    import json

    spec = {**SPEC, **changes}
    run = {
        "job_id": 1,
        "recipe": spec["recipe"],
        "params": {"width": 8, "samples": 512, "sleep_per_step_s": 0.0, "fail": False, "chatty": 0},
        "strategy": spec["strategy"],
        "accelerator": "cpu",
        "devices": spec["devices"],
        "epochs": spec["epochs"],
        "batch_size": spec["batch_size"],
        "lr": 1e-3,
        "optimizer": "adamw",
        "seed": spec["seed"],
        "precision": "fp32",
        "checkpoint_every": 1,
    }
    return _trained(json.dumps(run, sort_keys=True))


def log_texts(stack: Stack, job_id: int) -> list[str]:
    logs = stack.http.get(f"/jobs/{job_id}/logs", params={"limit": 10_000}).json()
    return [x["text"] for x in logs]


def test_two_boxes_train_the_weights_of_one_box_and_of_single(stack: Stack) -> None:
    start_box(stack, "box0")
    start_box(stack, "box1")
    job = stack.submit(**SPEC, devices=1, nodes=2)
    running = wait_for(
        lambda: (j := stack.job(job["id"]))["status"] in ("running", "succeeded") and j,
        60,
        "the gang to start the job",
    )
    if running["status"] == "running":  # which workers and devices it holds
        held = {(n["worker_id"], tuple(n["devices"])) for n in running["node_list"]}
        assert held == {("box0", (0,)), ("box1", (0,))}, running
    done = stack.wait_status(job["id"], {"succeeded", "failed"}, timeout_s=120)
    assert done["status"] == "succeeded" and done["attempt"] == 1, done
    texts = log_texts(stack, job["id"])
    prefixes = {t.split("]")[0] + "]" for t in texts if t.startswith("[node ")}
    assert {p.split(" rank")[0] for p in prefixes} == {"[node 0", "[node 1"}, prefixes
    assert {p.split(" rank ")[1] for p in prefixes} == {"0]", "1]"}, prefixes
    # The same world on one box (1 node x 2 ranks) and single on one device: the same weights.
    weights = model_of(stack, job["id"])
    assert_same_weights(weights, reference(devices=2))
    assert_same_weights(weights, reference(strategy="single", devices=1))
    # metrics and progress came from global rank 0
    assert stack.http.get(f"/jobs/{job['id']}/metrics").json()
    assert done["progress"]["step"] == done["progress"]["total_steps"]
    listed = cli(stack, "ls").stdout  # the CLI's list says it spans boxes
    assert f"{job['id']}  succeeded" in listed and "ddp 2 boxes x1" in listed, listed


def test_a_killed_box_stops_the_other_within_seconds_and_the_job_resumes(stack: Stack) -> None:
    """kill -9 one worker mid-job: the other node's ranks end within seconds (no rank left
    in a collective); the job goes back to the queue as one, and with the worker back it
    resumes from the shared checkpoint to the uninterrupted run's weights."""
    box0 = start_box(stack, "box0")
    start_box(stack, "box1")
    spec = {**SPEC, "epochs": 8, "params": {"samples": 512, "sleep_per_step_s": 0.1}}
    job = stack.submit(**spec, devices=1, nodes=2)
    wait_for(lambda: (stack.job(job["id"])["progress"] or {}).get("epoch", 0) >= 2, 90, "epoch 2")
    [(pgid,)] = stack.query(
        "SELECT runner_pgid FROM job_node WHERE job_id = :id AND worker_id = 'box1'", id=job["id"]
    )
    killed_at = time.monotonic()
    box0.send_signal(signal.SIGKILL)
    box0.wait(timeout=10)
    wait_for(lambda: group_members(pgid) == [], 30, "box1's ranks to end")
    ended_in = time.monotonic() - killed_at
    assert ended_in < LEASE_S + 10, ended_in
    requeued = stack.wait_status(job["id"], {"queued", "failed"}, timeout_s=30)
    assert requeued["status"] == "queued", requeued
    start_box(stack, "box0")  # the box comes back: the next attempt forms a new gang
    done = stack.wait_status(job["id"], {"succeeded", "failed"}, timeout_s=180)
    assert done["status"] == "succeeded" and done["attempt"] == 2, done
    assert any("resuming from epoch-" in t for t in log_texts(stack, job["id"]))
    assert_same_weights(model_of(stack, job["id"]), reference(devices=2, epochs=8))


def test_a_gang_that_cannot_fill_gives_its_devices_back(stack: Stack) -> None:
    """One box running for a two-node job: it holds its slot for the job for
    gang_timeout_s, then gives it back, and a small job queued behind runs."""
    start_box(stack, "box0", gang_timeout_s=2)
    box1 = start_box(stack, "box1")  # registered (the submit counts it), then stopped
    box1.send_signal(signal.SIGTERM)
    assert box1.wait(timeout=30) == 0
    big = stack.submit(**SPEC, devices=1, nodes=2)
    waiting = wait_for(
        lambda: (j := stack.job(big["id"]))["node_list"] and j, 30, "box0 to join the gang"
    )
    assert "1 of 2 nodes free" in waiting["reason"]["message"], waiting["reason"]
    small = stack.submit(**{**SPEC, "strategy": "single"}, devices=1)
    done = stack.wait_status(small["id"], {"succeeded", "failed"}, timeout_s=60)
    assert done["status"] == "succeeded"
    assert stack.job(big["id"])["status"] == "queued"


def test_a_torchrun_script_spans_two_boxes_unchanged(stack: Stack, tmp_path: Path) -> None:
    """The torchrun example, as it is, on 2 boxes x 1 rank: global RANK and WORLD_SIZE,
    its lines behind [node N rank R], its snapshot in the shared folder, and the weights
    of the same script run by hand under torchrun with 2 ranks on one box."""
    # both boxes mount one DATA_DIR, the API's: each node's hand-offs in its own folder
    start_box(stack, "box0", own_data_dir=False)
    start_box(stack, "box1", own_data_dir=False)
    command = ["torchrun_resume/train.py", "--epochs", "2"]
    job = submit_example(stack, tmp_path, ["python", *command], strategy="ddp", devices=1, nodes=2)
    done = stack.wait_status(job["id"], {"succeeded", "failed"}, timeout_s=180)
    assert done["status"] == "succeeded" and done["attempt"] == 1, done
    lines = log_texts(stack, job["id"])
    saved = [t for t in lines if "Epoch 2 | Training snapshot saved" in t]
    assert len(saved) == 1 and saved[0].startswith("[node "), lines  # global rank 0 saves
    for node in (0, 1):  # each box started its part (only global rank 0 prints)
        assert any(f"started node {node} of 2 on box" in t for t in lines), lines
    assert (stack.tmp / "shared" / "jobs" / str(job["id"]) / "checkpoints" / "snapshot.pt").exists()
    runner = stack.tmp / "data" / "jobs" / str(job["id"]) / ".runner"
    # Global rank 0 may be on either box (c10d ranks nodes as they arrive), and the job
    # is succeeded once that node reports: the other node's runner may still be writing.
    hand_offs = [runner / f"node-{node}" / "attempt-1.json" for node in (0, 1)]
    wait_for(lambda: all(p.exists() for p in hand_offs), 30, "each node's own hand-off")
    weights = stack.http.get(f"/jobs/{job['id']}/artifacts/output/model.pt")
    assert weights.status_code == 200  # the API serves it from the one DATA_DIR
    # (within 1e-4: each box runs its rank with two threads, torchrun by hand with one)
    assert_same_weights(torch.load(io.BytesIO(weights.content)), by_hand(tmp_path, command))


def test_a_preempted_gang_stops_on_every_box_and_resumes_to_the_same_weights(
    stack: Stack,
) -> None:
    """A job across boxes is preempted like any other: a job that outranks it and waits
    stops it, the whole gang checkpoints and goes back to the queue without spending an
    attempt, and it resumes (a new gang) to the weights of an uninterrupted run."""
    for name in ("box0", "box1"):
        start_box(stack, name, preempt_after_s=1, preempt_cooldown_s=3600)
    spec = {**SPEC, "epochs": 8, "params": {"samples": 512, "sleep_per_step_s": 0.1}}
    gang = stack.submit(**spec, devices=1, nodes=2)
    wait_for(lambda: (stack.job(gang["id"])["progress"] or {}).get("epoch", 0) >= 2, 90, "epoch 2")
    urgent = stack.submit(**{**SPEC, "strategy": "single"}, priority=5)
    back = stack.wait_status(gang["id"], {"queued", "failed", "succeeded"}, timeout_s=60)
    assert back["status"] == "queued" and back["attempt"] == 1, back
    assert back["reason"]["code"] == "preempted", back["reason"]
    assert stack.wait_status(urgent["id"], {"succeeded", "failed"})["status"] == "succeeded"
    done = stack.wait_status(gang["id"], {"succeeded", "failed"}, timeout_s=180)
    assert done["status"] == "succeeded" and done["attempt"] == 1, done
    assert any("resuming from epoch-" in t for t in log_texts(stack, gang["id"]))
    assert_same_weights(model_of(stack, gang["id"]), reference(devices=2, epochs=8))
    events = stack.http.get("/audit", params={"limit": 500}).json()["items"]
    marks = [e for e in events if e["action"] == "preempted"]
    assert [e["target"] for e in marks] == [f"job {gang['id']}"], marks  # once, not per node
