"""The batch script a job becomes, and how Slurm's ends map to Trainyard's: pure
functions, checked here where no GPU and no cluster is needed (the cluster's own tests
run the scripts: tests/slurm/)."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.models import Job, JobStatus
from service.reasons import ReasonCode
from service.settings import Settings
from workers.outcome import RunnerReport, StopReason
from workers.slurm import batch, ends
from workers.slurm.cluster import SlurmJob, seconds


def _job(**fields: object) -> Job:
    spec = {"id": 7, "recipe": "tiny", "strategy": "ddp", "accelerator": "cuda", "devices": 4}
    return Job.model_validate({**spec, **fields})


def _script(job: Job, tmp_path: Path, **settings: object) -> str:
    attempt = batch.Attempt(
        job=job,
        attempt=2,
        worker_id="submit-host",
        handoff=tmp_path / "h.json",
        output=tmp_path / "o.out",
        error=tmp_path / "o.err",
        alive=tmp_path / "w.alive",
        lease_s=15,
    )
    return batch.script(job, Settings(**settings), attempt, python="/opt/py", threads=1)  # type: ignore[arg-type]


def test_a_gpu_partition_gets_gpus_per_node_or_gres(tmp_path: Path) -> None:
    job = _job(nodes=2, timeout_s=3600)
    text = _script(job, tmp_path, slurm_gpus_per_node=8, slurm_partition="a100",
                   slurm_account="vision", slurm_qos="high",
                   slurm_sbatch_options="--constraint=nvlink --exclusive")  # fmt: skip
    options = [
        line.removeprefix("#SBATCH ") for line in text.splitlines() if line.startswith("#SBATCH")
    ]
    assert options[:4] == [
        "--job-name=trainyard-7",
        "--comment=trainyard/job=7/attempt=2/worker=submit-host",
        "--nodes=2",
        "--ntasks-per-node=1",
    ]
    for wanted in ("--gpus-per-node=4", "--cpus-per-task=4", "--time=63:00", "--signal=TERM@60",
                   "--no-requeue", "--partition=a100", "--account=vision", "--qos=high",
                   "--constraint=nvlink", "--exclusive", f"--output={tmp_path}/o.out"):  # fmt: skip
        assert wanted in options, (wanted, options)
    assert "--accelerator cuda" in text and "--node-from-env SLURM_NODEID" in text
    assert f"alive={tmp_path}/w.alive" in text and "-gt 25 ]" in text  # the lease watch
    gres = _script(job, tmp_path, slurm_gpus_per_node=8, slurm_gpu_option="gres")
    assert "#SBATCH --gres=gpu:4\n" in gres and "--gpus-per-node" not in gres


def test_a_cpu_partition_asks_for_cpus_and_one_node_runs_as_on_a_box(tmp_path: Path) -> None:
    text = _script(_job(accelerator="cpu", devices=2), tmp_path)
    assert "#SBATCH --cpus-per-task=2\n" in text and "gpu" not in text
    assert "--time" not in text  # no timeout_s: the partition's limit
    assert text.rstrip().splitlines()[-1].startswith("exec srun --kill-on-bad-exit=1")
    assert "--rendezvous" not in text and "--accelerator cpu" in text


def test_squeues_time_used_in_seconds() -> None:
    assert [seconds(t) for t in ("0:07", "5:03", "1:02:03", "2-01:02:03")] == [
        7,
        303,
        3723,
        2 * 86400 + 3723,
    ]
    assert seconds("INVALID") == seconds("") == 0


def test_a_comment_names_its_attempt_and_nothing_else_parses() -> None:
    said = batch.comment("box a/b", 12, 3).replace(" ", "_")
    assert batch.parse_comment(said) == ("box_a/b", 12, 3)
    for other in ("", "trainyard", "someone else's job", "trainyard/job=x/attempt=1/worker=w"):
        assert batch.parse_comment(other) is None


def _seen(state: str) -> SlurmJob:
    return SlurmJob("41", state, "None", "n1", 12.0, "")


@pytest.mark.parametrize(
    ("state", "status", "code"),
    [
        ("PREEMPTED", JobStatus.queued, ReasonCode.preempted),  # no attempt spent
        ("TIMEOUT", JobStatus.failed, ReasonCode.timeout),
        ("NODE_FAIL", JobStatus.failed, ReasonCode.worker_lost),
        ("FAILED", JobStatus.failed, ReasonCode.runner_died),  # killed: no report
        ("CANCELLED", JobStatus.failed, ReasonCode.runner_died),  # someone else's scancel
    ],
)
def test_slurms_ends_without_a_report(state: str, status: JobStatus, code: ReasonCode) -> None:
    got = ends.outcome("41", _seen(state), [], None, exit_code="0:9", timeout_s=60,
                       stall_timeout_s=300, worker_id="w")  # fmt: skip
    assert (got.status, got.reason_code) == (status, code), got
    assert "Slurm job 41" in got.reason_message
    assert got.retryable == (status == JobStatus.failed and code != ReasonCode.timeout)


def test_a_partitions_time_limit_resumes_a_checkpointed_run_in_the_next_allocation() -> None:
    """No timeout_s of its own: the partition's limit ended it, after it checkpointed at
    Slurm's SIGTERM; it goes on, no attempt spent. With a timeout_s it is a timeout."""
    stopped = RunnerReport(ok=False, preempted="epoch 3, batch 17")
    got = ends.outcome("41", _seen("TIMEOUT"), [stopped], None, exit_code=None,
                       timeout_s=None, stall_timeout_s=300, worker_id="w")  # fmt: skip
    assert (got.status, got.reason_code) == (JobStatus.queued, ReasonCode.preempted), got
    assert "partition's time limit" in got.reason_message and "epoch 3" in got.reason_message
    got = ends.outcome("41", _seen("TIMEOUT"), [stopped], None, exit_code=None,
                       timeout_s=600, stall_timeout_s=300, worker_id="w")  # fmt: skip
    assert (got.status, got.reason_code) == (JobStatus.failed, ReasonCode.timeout), got


def test_the_report_decides_where_slurm_says_the_job_ran() -> None:
    ok = RunnerReport(ok=True, result={"loss": 0.5})
    got = ends.outcome("41", _seen("COMPLETED"), [ok], None, exit_code=None, timeout_s=None,
                       stall_timeout_s=300, worker_id="w")  # fmt: skip
    assert got.status == JobStatus.succeeded and got.result == {"loss": 0.5}
    # a job that finished as Slurm preempted it has succeeded
    got = ends.outcome("41", _seen("PREEMPTED"), [ok], None, exit_code=None, timeout_s=None,
                       stall_timeout_s=300, worker_id="w")  # fmt: skip
    assert got.status == JobStatus.succeeded
    # a cancel the worker asked for decides, whatever Slurm's state
    got = ends.outcome("41", _seen("CANCELLED"), [], StopReason.cancel, exit_code=None,
                       timeout_s=None, stall_timeout_s=300, worker_id="w")  # fmt: skip
    assert got.status == JobStatus.cancelled
    # across nodes: the leader's report ends it, a follower's ok alone does not
    follower = RunnerReport(ok=True, leader=False)
    failed = RunnerReport(ok=False, error={"type": "RuntimeError", "message": "x", "own": True})
    assert ends.leader([follower, failed]) is failed
    assert ends.leader([follower, ok]) is ok
    got = ends.outcome("41", None, [follower], None, exit_code=None, timeout_s=None,
                       stall_timeout_s=300, worker_id="w")  # fmt: skip
    assert got.reason_code == ReasonCode.worker_lost and got.retryable
