"""Jobs through a real Slurm cluster (tests/slurm_cluster.py): submitted by the Slurm
worker, run by slurmd on nodes n1 and n2 of this host, watched back into Trainyard.

The API runs on SQLite: a Slurm worker serves from one submit host, and what the store
does for it (the claim, the fence, the reason) is the store's on both databases."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load

from tests.e2e.test_chaos import assert_same_weights
from tests.e2e.test_multi_node import SPEC as ACROSS
from tests.e2e.test_multi_node import reference
from tests.e2e.test_script_jobs import by_hand, submit_example
from tests.slurm.conftest import start_slurm_worker
from tests.slurm_cluster import SlurmCluster
from tests.stack import Stack, wait_for
from workers.jobfiles import MODEL_FILE

pytestmark = pytest.mark.slow

# Long enough to act on mid-run: 4 epochs of 8 steps, 0.15 s each, a checkpoint per epoch.
SLOW: dict[str, Any] = {
    **ACROSS,
    "strategy": "single",
    "devices": 1,
    "epochs": 4,
    "params": {"samples": 512, "sleep_per_step_s": 0.15},
}


def log_texts(stack: Stack, job_id: int) -> list[str]:
    logs = stack.http.get(f"/jobs/{job_id}/logs", params={"limit": 10_000}).json()
    return [x["text"] for x in logs]


def slurm_id(stack: Stack, job_id: int) -> str:
    def recorded() -> str | None:
        [(executor_id,)] = stack.query("SELECT executor_id FROM job WHERE id = :id", id=job_id)
        return executor_id  # type: ignore[no-any-return]

    return wait_for(recorded, 30, f"job {job_id}'s Slurm job id")


def running_in_slurm(stack: Stack, job_id: int, step: int = 1) -> dict[str, Any]:
    """The job once Slurm runs it and it has trained ``step`` steps."""
    return wait_for(
        lambda: (
            (j := stack.job(job_id))["reason"]["code"] == "running"
            and (j["progress"] or {}).get("step", 0) >= step
            and j
        ),
        90,
        f"job {job_id} to train {step} step(s) in Slurm",
    )


def weights(stack: Stack, job_id: int) -> dict[str, torch.Tensor]:
    return load((stack.tmp / "data" / "jobs" / str(job_id) / MODEL_FILE).read_bytes())


def nothing_left(cluster: SlurmCluster, slurm_job: str, timeout_s: float = 30) -> None:
    """Not in squeue, and no process of it on any node."""
    gone = f"Slurm job {slurm_job} to go"
    wait_for(lambda: slurm_job not in cluster.squeue_ids(), timeout_s, gone)
    wait_for(lambda: not cluster.job_processes(slurm_job), 30, f"Slurm job {slurm_job}'s processes")


def test_a_two_node_ddp_job_ends_with_the_weights_of_one_node(
    slurm_stack: Stack, cluster: SlurmCluster
) -> None:
    """2 nodes x 1 rank through srun and torch's elastic launch: the weights of 1 x 2; its
    ranks' lines prefixed by node; the batch script asked for both nodes."""
    start_slurm_worker(slurm_stack)
    job = slurm_stack.submit(**ACROSS, devices=1, nodes=2)
    done = slurm_stack.wait_status(job["id"], {"succeeded", "failed"}, timeout_s=150)
    texts = log_texts(slurm_stack, job["id"])
    assert done["status"] == "succeeded" and done["attempt"] == 1, (done, texts)
    assert {t.split(" rank")[0] for t in texts if t.startswith("[node ")} == {"[node 0", "[node 1"}
    assert_same_weights(weights(slurm_stack, job["id"]), reference(devices=2))
    script = slurm_stack.tmp / "data" / "jobs" / str(job["id"]) / ".runner" / "attempt-1-slurm.sh"
    assert "#SBATCH --nodes=2\n" in script.read_text()
    assert slurm_stack.http.get(f"/jobs/{job['id']}/metrics").json()


def test_a_torchrun_script_spans_both_nodes_unchanged(
    slurm_stack: Stack, cluster: SlurmCluster, tmp_path: Path
) -> None:
    """The torchrun example as it is, on 2 nodes x 1 rank: the weights of the same script
    run by hand under torchrun with 2 ranks."""
    start_slurm_worker(slurm_stack)
    command = ["torchrun_resume/train.py", "--epochs", "2"]
    job = submit_example(
        slurm_stack, tmp_path, ["python", *command], strategy="ddp", devices=1, nodes=2
    )
    done = slurm_stack.wait_status(job["id"], {"succeeded", "failed"}, timeout_s=180)
    assert done["status"] == "succeeded", (done, log_texts(slurm_stack, job["id"]))
    got = slurm_stack.http.get(f"/jobs/{job['id']}/artifacts/output/model.pt")
    assert got.status_code == 200
    assert_same_weights(torch.load(io.BytesIO(got.content)), by_hand(tmp_path, command))


def test_a_pending_job_shows_slurms_reason_and_cancels_from_any_state(
    slurm_stack: Stack, cluster: SlurmCluster
) -> None:
    start_slurm_worker(slurm_stack)
    cluster.set_partition_state("DOWN")
    try:
        pending = slurm_stack.submit(**SLOW)
        waiting = wait_for(
            lambda: (
                "PartitionDown" in (j := slurm_stack.job(pending["id"]))["reason"]["message"] and j
            ),
            30,
            "Slurm's reason on the job",
        )
        assert waiting["reason"]["code"] == "slurm_pending", waiting
        pending_id = slurm_id(slurm_stack, pending["id"])
        assert slurm_stack.http.post(f"/jobs/{pending['id']}/cancel").status_code == 202
        done = slurm_stack.wait_status(pending["id"], {"cancelled"}, timeout_s=30)
        assert done["reason"]["code"] == "cancelled"
        nothing_left(cluster, pending_id)
    finally:
        cluster.set_partition_state("UP")
    running = slurm_stack.submit(**SLOW)
    running_in_slurm(slurm_stack, running["id"])
    running_id = slurm_id(slurm_stack, running["id"])
    assert cluster.job_processes(running_id)
    assert slurm_stack.http.post(f"/jobs/{running['id']}/cancel").status_code == 202
    done = slurm_stack.wait_status(running["id"], {"cancelled"}, timeout_s=60)
    assert done["reason"]["code"] == "cancelled", done
    nothing_left(cluster, running_id)


def test_a_jobs_environment_holds_no_credential(
    slurm_stack: Stack, cluster: SlurmCluster, tmp_path: Path
) -> None:
    """The worker's environment has the database URL and an API token; the batch job's
    processes get neither (sbatch is given the allow-list), nor does the hand-off."""
    start_slurm_worker(slurm_stack, env={"TRAINYARD_API_TOKEN": "s3cret-token-for-the-test-only"})
    token = {"Authorization": "Bearer s3cret-token-for-the-test-only"}
    slurm_stack.http.headers.update(token)
    # the script's own environment, and its runner's (the batch job's, as sbatch gave it)
    show = (
        "import os; print('ENV', sorted(os.environ)); "
        "print('RUNNER', open(f'/proc/{os.getppid()}/environ').read().replace(chr(0), ' '))"
    )
    job = submit_example(slurm_stack, tmp_path, ["python", "-c", show])
    done = slurm_stack.wait_status(job["id"], {"succeeded", "failed"}, timeout_s=120)
    texts = log_texts(slurm_stack, job["id"])
    assert done["status"] == "succeeded", (done, texts)
    printed = " ".join(t for t in texts if "ENV [" in t or "RUNNER " in t)
    assert "SLURM_JOB_ID" in printed, texts  # the runner ran under Slurm
    assert "TRAINYARD_DATABASE_URL" not in printed and "TRAINYARD_API_TOKEN" not in printed
    assert "s3cret" not in printed
    runner = slurm_stack.tmp / "data" / "jobs" / str(job["id"]) / ".runner"
    handoff = (runner / "attempt-1-handoff.json").read_text()
    assert "s3cret" not in handoff and "sqlite" not in handoff and "lease_token" not in handoff
