"""Boxes that share no folder, only an object store: two real workers with their own data
directories, the API with a third, a real S3-compatible server (moto, on loopback behind
a relay that can take it down), a real PostgreSQL."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from safetensors.torch import load

from service.objects import layout
from tests.e2e.conftest import one_database
from tests.e2e.test_chaos import assert_same_weights
from tests.e2e.test_multi_node import SPEC, log_texts, reference
from tests.object_store import S3Server
from tests.stack import Stack, running_stack, wait_for
from workers.jobfiles import MODEL_FILE

# Boxes share PostgreSQL (a job across boxes needs it); nothing here depends on the kind.
pytestmark = [pytest.mark.slow, one_database("postgresql")]

LEASE_S = 4  # a killed worker's job is requeued this soon (the default is 15 s)


@pytest.fixture
def stack(s3: S3Server, tmp_path: Path, database_url: str) -> Iterator[Stack]:
    """The API with the store (and the store's endpoint and keys, as the s3 fixture set
    them in this process's environment), on a data folder no worker writes to."""
    with running_stack(tmp_path, database_url, storage_url=s3.url) as s:
        yield s


def start_box(stack: Stack, s3: S3Server, name: str, **settings: object) -> subprocess.Popen[bytes]:
    """A worker as if on a box of its own: one CPU slot, its own data folder, no shared
    folder; the object store."""
    defaults: dict[str, object] = {"cpu_slots": 1, "lease_s": LEASE_S, "gang_timeout_s": 30}
    return stack.start_worker(
        name,
        env={"TRAINYARD_DATA_DIR": str(stack.tmp / name), **s3.env},
        storage_url=s3.url,
        **{**defaults, **settings},
    )


def manifests(s3: S3Server, job_id: int) -> list[layout.Manifest]:
    store = s3.store()
    return [
        layout.Manifest.model_validate_json(store.get_bytes(m.key, limit=1 << 20))
        for m in store.listing(layout.manifests_prefix(job_id))
    ]


def checkpointed(stack: Stack, s3: S3Server, job_id: int) -> bool:
    """Past epoch 2, with a checkpoint in the store."""
    epoch = (stack.job(job_id)["progress"] or {}).get("epoch", 0)
    return epoch >= 2 and bool(manifests(s3, job_id))


def slow(epochs: int, **changes: Any) -> dict[str, Any]:
    """The tiny recipe, slow enough to be stopped midway (~2 s an epoch)."""
    return {
        **SPEC,
        "strategy": "single",
        "devices": 1,
        "epochs": epochs,
        "params": {"samples": 512, "sleep_per_step_s": 0.25},
        **changes,
    }


def test_a_killed_box_s_job_resumes_on_another_from_the_store_and_its_weights_download(
    stack: Stack, s3: S3Server
) -> None:
    """kill -9 of the worker mid-job: its job resumes on another box, whose data folder
    never saw it, from the newest checkpoint in the store, and ends with the weights of a
    run never interrupted; the API, on a third folder, serves them from the store."""
    box0 = start_box(stack, s3, "box0")
    job = stack.submit(**slow(8))
    wait_for(lambda: checkpointed(stack, s3, job["id"]), 90, "a checkpoint in the store")
    box0.send_signal(signal.SIGKILL)
    box0.wait(timeout=10)
    start_box(stack, s3, "box1")
    done = stack.wait_status(job["id"], {"succeeded", "failed"}, timeout_s=180)
    assert done["status"] == "succeeded" and done["attempt"] == 2, done
    texts = log_texts(stack, job["id"])
    assert any("checkpoints: resuming from the store's newest" in t for t in texts), texts
    assert any("resuming from epoch-" in t for t in texts), texts
    weights = load((stack.tmp / "box1" / "jobs" / str(job["id"]) / MODEL_FILE).read_bytes())
    assert_same_weights(weights, reference(strategy="single", devices=1, epochs=8))
    # The API's own folder has nothing of the job: the listing and the bytes are the store's.
    listed = {a["name"] for a in stack.http.get(f"/jobs/{job['id']}/artifacts").json()}
    assert {MODEL_FILE, "spec.json"} <= listed, listed
    assert any(n.startswith("checkpoints/epoch-") for n in listed), listed
    got = stack.http.get(f"/jobs/{job['id']}/artifacts/{MODEL_FILE}")
    assert got.status_code == 200, got.text
    assert_same_weights(load(got.content), weights)


def test_the_store_down_mid_job_training_goes_on_and_the_checkpoints_follow(
    stack: Stack, s3: S3Server
) -> None:
    """The store stops answering mid-job: training goes on, the job's log and reason say
    its checkpoints wait on the box; started again, the newest goes up, and the job's
    end waits for its last checkpoint and weights to be in the store."""
    start_box(stack, s3, "box0")
    job = stack.submit(**slow(8))
    wait_for(lambda: manifests(s3, job["id"]), 60, "a first checkpoint in the store")
    s3.stop()
    try:
        waiting = wait_for(
            lambda: (
                "wait on box0's disk" in (stack.job(job["id"])["reason"]["message"] or "")
                and stack.job(job["id"])
            ),
            60,
            "the reason to say the checkpoints wait",
        )
        assert waiting["status"] == "running", waiting
        epoch_then = (waiting["progress"] or {}).get("epoch", 0)
        wait_for(
            lambda: (stack.job(job["id"])["progress"] or {}).get("epoch", 0) >= epoch_then + 2,
            60,
            "training to go on without the store",
        )
    finally:
        s3.start()
    done = stack.wait_status(job["id"], {"succeeded", "failed"}, timeout_s=180)
    assert done["status"] == "succeeded", done
    texts = log_texts(stack, job["id"])
    assert any("wait on box0's disk" in t for t in texts), texts
    assert any("go to the object store again" in t for t in texts), texts
    newest = manifests(s3, job["id"])[-1]
    assert [f.name for f in newest.files][-1] == "epoch-000008-batch-00000000.pt", newest
    stored = layout.stored_artifacts(s3.store(), job["id"])
    assert stored is not None and MODEL_FILE in stored.by_name(), stored


def test_a_job_across_boxes_checkpoints_and_resumes_through_the_store(
    stack: Stack, s3: S3Server
) -> None:
    """Two boxes with no shared folder take a job across both; one is killed mid-job; with
    it back, every node of the next attempt resumes from the store's newest checkpoint to
    the uninterrupted run's weights."""
    box0 = start_box(stack, s3, "box0")
    start_box(stack, s3, "box1")
    spec = {**SPEC, "epochs": 6, "params": {"samples": 512, "sleep_per_step_s": 0.1}}
    job = stack.submit(**spec, devices=1, nodes=2)
    wait_for(lambda: checkpointed(stack, s3, job["id"]), 120, "a checkpoint in the store")
    box0.send_signal(signal.SIGKILL)
    box0.wait(timeout=10)
    requeued = stack.wait_status(job["id"], {"queued", "failed"}, timeout_s=60)
    assert requeued["status"] == "queued", requeued
    start_box(stack, s3, "box0")
    done = stack.wait_status(job["id"], {"succeeded", "failed"}, timeout_s=180)
    assert done["status"] == "succeeded" and done["attempt"] == 2, done
    texts = log_texts(stack, job["id"])
    assert sum("checkpoints: resuming from the store's newest" in t for t in texts) >= 1, texts
    [path] = list(stack.tmp.glob(f"box*/jobs/{job['id']}/{MODEL_FILE}"))
    assert_same_weights(load(path.read_bytes()), reference(devices=2, epochs=6))
    got = stack.http.get(f"/jobs/{job['id']}/artifacts/{MODEL_FILE}")
    assert got.status_code == 200, got.text
