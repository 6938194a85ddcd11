"""Jobs through a real Slurm cluster: submitted by the Slurm worker, run by slurmd on
nodes n1 and n2, watched back into Trainyard."""

from __future__ import annotations

from typing import Any

import pytest

from tests.slurm.conftest import start_slurm_worker
from tests.slurm_cluster import SlurmCluster
from tests.stack import Stack

pytestmark = pytest.mark.slow

SPEC: dict[str, Any] = {
    "recipe": "tiny",
    "strategy": "single",
    "accelerator": "cpu",
    "batch_size": 64,
    "epochs": 2,
    "seed": 11,
    "params": {"samples": 256},
}


def log_texts(stack: Stack, job_id: int) -> list[str]:
    logs = stack.http.get(f"/jobs/{job_id}/logs", params={"limit": 10_000}).json()
    return [x["text"] for x in logs]


def test_a_one_node_recipe_job_runs_through_slurm(
    slurm_stack: Stack, cluster: SlurmCluster
) -> None:
    start_slurm_worker(slurm_stack)
    job = slurm_stack.submit(**SPEC)
    done = slurm_stack.wait_status(job["id"], {"succeeded", "failed"}, timeout_s=120)
    texts = log_texts(slurm_stack, job["id"])
    assert done["status"] == "succeeded", (done, texts)
    assert any("submitted to Slurm" in t for t in texts), texts
    assert any(t.startswith("[rank 0]") for t in texts), texts
    assert slurm_stack.http.get(f"/jobs/{job['id']}/metrics").json()
