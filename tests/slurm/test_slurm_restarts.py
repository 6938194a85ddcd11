"""Restarts, stops and retries through a real Slurm cluster: a Slurm job killed by hand,
the Slurm worker killed and restarted or left silent, a timeout. (In a file of their own:
the suite runs files on two processes side by side.)"""

from __future__ import annotations

import os
import signal

import pytest

from tests.e2e.test_chaos import assert_same_weights
from tests.e2e.test_multi_node import reference
from tests.slurm.conftest import start_slurm_worker
from tests.slurm.test_slurm_jobs import (
    SLOW,
    log_texts,
    nothing_left,
    running_in_slurm,
    slurm_id,
    weights,
)
from tests.slurm_cluster import SlurmCluster
from tests.stack import Stack, wait_for

pytestmark = pytest.mark.slow


def test_a_slurm_job_killed_by_hand_is_requeued_and_resumes_from_its_checkpoint(
    slurm_stack: Stack, cluster: SlurmCluster
) -> None:
    """scancel --signal=KILL by someone else: the attempt ends without a report, is
    retried, and the next Slurm job resumes from the checkpoint to the uninterrupted
    run's weights."""
    start_slurm_worker(slurm_stack)
    job = slurm_stack.submit(**SLOW)
    running_in_slurm(slurm_stack, job["id"], step=12)  # past the first epoch's checkpoint
    first = slurm_id(slurm_stack, job["id"])
    cluster.run("scancel", "--signal=KILL", first)
    done = slurm_stack.wait_status(job["id"], {"succeeded", "failed"}, timeout_s=150)
    texts = log_texts(slurm_stack, job["id"])
    assert done["status"] == "succeeded" and done["attempt"] == 2, (done, texts)
    submitted = [t for t in texts if "submitted to Slurm" in t]
    assert len(submitted) == 2 and f"Slurm job {first}," in submitted[0], submitted
    assert any("resum" in t.lower() for t in texts if t.startswith("[rank 0]")), texts
    spec = {k: v for k, v in SLOW.items() if k != "params"}
    assert_same_weights(weights(slurm_stack, job["id"]), reference(**spec))


def test_a_killed_slurm_worker_adopts_its_jobs_when_restarted(
    slurm_stack: Stack, cluster: SlurmCluster
) -> None:
    """kill -9 of the worker mid-job: Slurm runs the job on; the restarted worker takes
    it back (same attempt, same Slurm job) rather than submitting it again."""
    worker = start_slurm_worker(slurm_stack, lease_s=60)
    job = slurm_stack.submit(**{**SLOW, "epochs": 10})  # runs on while no worker watches
    running_in_slurm(slurm_stack, job["id"], step=2)
    first = slurm_id(slurm_stack, job["id"])
    os.kill(worker.pid, signal.SIGKILL)
    worker.wait()
    assert first in cluster.squeue_ids()  # the job outlives its worker
    start_slurm_worker(slurm_stack, lease_s=60)
    done = slurm_stack.wait_status(job["id"], {"succeeded", "failed"}, timeout_s=120)
    texts = log_texts(slurm_stack, job["id"])
    assert done["status"] == "succeeded" and done["attempt"] == 1, (done, texts)
    assert any(f"adopted by slurm after a restart (Slurm job {first})" in t for t in texts)
    assert sum("submitted to Slurm" in t for t in texts) == 1, texts
    # its output read on from what was stored before the kill: no line twice
    assert sum("attempt 1: single on 1 cpu" in t for t in texts) == 1, texts


def test_a_job_whose_worker_stays_silent_stops_itself_and_runs_again(
    slurm_stack: Stack, cluster: SlurmCluster
) -> None:
    """kill -9 of the worker, not restarted: past its lease (and the clocks' slack) the
    batch job cancels itself, so no later attempt shares its folder with it; a worker
    started then requeues the job and it runs again."""
    worker = start_slurm_worker(slurm_stack, lease_s=3)
    job = slurm_stack.submit(**{**SLOW, "epochs": 12})
    running_in_slurm(slurm_stack, job["id"])
    first = slurm_id(slurm_stack, job["id"])
    os.kill(worker.pid, signal.SIGKILL)
    worker.wait()
    # (LEASE_S 3 s + 10 s of slack, seen on two looks 2 s apart, then scancel's KillWait)
    nothing_left(cluster, first, timeout_s=60)  # no worker wrote meanwhile: it stopped itself
    [(code,)] = slurm_stack.query("SELECT status FROM job WHERE id = :id", id=job["id"])
    assert code == "running"  # nothing else ran meanwhile: its lease simply lapsed
    start_slurm_worker(slurm_stack, lease_s=3)
    again = wait_for(
        lambda: (j := slurm_stack.job(job["id"]))["attempt"] == 2 and j, 30, "the next attempt"
    )
    assert again["reason"]["code"] in ("worker_lost", "slurm_pending", "running"), again
    assert wait_for(lambda: slurm_id(slurm_stack, job["id"]), 30, "its next Slurm job") != first
    slurm_stack.http.post(f"/jobs/{job['id']}/cancel")


def test_a_job_past_its_timeout_is_stopped_and_fails(
    slurm_stack: Stack, cluster: SlurmCluster
) -> None:
    start_slurm_worker(slurm_stack)
    job = slurm_stack.submit(**{**SLOW, "epochs": 12, "timeout_s": 4})
    ran = slurm_id(slurm_stack, job["id"])
    done = slurm_stack.wait_status(job["id"], {"succeeded", "failed"}, timeout_s=90)
    assert done["status"] == "failed" and done["reason"]["code"] == "timeout", done
    nothing_left(cluster, ran)
