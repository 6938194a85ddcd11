"""The test Slurm cluster itself: jobs run across both nodes, and cancel leaves nothing."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.slurm_cluster import SlurmCluster

WAIT_S = 20.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    reason = SlurmCluster.available()
    if reason:
        pytest.skip(reason)
    with SlurmCluster(tmp_path_factory.mktemp("slurm")) as started:
        yield started


def submit(cluster: SlurmCluster, out: Path, *args: str) -> str:
    done = cluster.run("sbatch", "--parsable", f"--output={out}", *args)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().split(";")[0]


def test_srun_runs_a_task_on_each_node(cluster: SlurmCluster, tmp_path: Path) -> None:
    out = tmp_path / "job.out"
    # the venv's Python, as the workers' jobs will run it
    task = f'{sys.executable} -c \'import os; print("node", os.environ["SLURM_NODEID"])\''
    job = submit(cluster, out, "--nodes=2", "--wrap", f"srun {task}")

    fields = cluster.wait_state(job, "COMPLETED", "FAILED", "CANCELLED", timeout=WAIT_S)

    assert (fields["JobState"], fields["ExitCode"]) == ("COMPLETED", "0:0"), out.read_text()
    assert sorted(out.read_text().splitlines()) == ["node 0", "node 1"]
    assert fields["NodeList"] == "n[1-2]"


def test_cancel_leaves_no_job_and_no_process(cluster: SlurmCluster, tmp_path: Path) -> None:
    job = submit(cluster, tmp_path / "job.out", "--wrap", "sleep 300")
    cluster.wait_state(job, "RUNNING", timeout=WAIT_S)
    deadline = time.monotonic() + WAIT_S  # RUNNING comes a moment before its processes
    while not cluster.job_processes(job) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert cluster.job_processes(job)

    assert cluster.run("scancel", job).returncode == 0

    assert cluster.wait_state(job, "CANCELLED", timeout=WAIT_S)["ExitCode"] == "0:15"
    deadline = time.monotonic() + WAIT_S
    while (job in cluster.squeue_ids() or cluster.job_processes(job)) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.1)
    assert job not in cluster.squeue_ids()
    assert cluster.job_processes(job) == []
