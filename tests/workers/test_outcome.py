"""How an attempt ended: the supervisor's stop reasons over the runner's own report."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from service.models import JobStatus
from service.reasons import ReasonCode
from workers.errors import NotRetryable, describe
from workers.outcome import RunnerReport, StopReason, decide, how_it_ended

LIMITS = {"timeout_s": 60, "stall_timeout_s": 600.0, "worker_id": "box-1"}
FAILED = RunnerReport(
    ok=False, error={"type": "ValueError", "message": "bad", "code": "error", "retryable": True}
)


@pytest.mark.parametrize(
    ("stop", "status", "code", "retryable"),
    [
        (StopReason.cancel, JobStatus.cancelled, ReasonCode.cancelled, False),
        (StopReason.timeout, JobStatus.failed, ReasonCode.timeout, False),
        (StopReason.stalled, JobStatus.failed, ReasonCode.stalled, True),
        (StopReason.shutdown, JobStatus.queued, ReasonCode.worker_shutdown, False),
    ],
)
def test_a_stop_the_supervisor_asked_for_decides_whatever_the_runner_said(
    stop: StopReason, status: JobStatus, code: ReasonCode, retryable: bool
) -> None:
    for report in (None, FAILED, RunnerReport(ok=True, result={"loss": 0.1})):
        outcome = decide(stop, report, 0, **LIMITS)  # type: ignore[arg-type]
        assert (outcome.status, outcome.reason_code, outcome.retryable) == (status, code, retryable)


def test_a_lost_lease_has_no_outcome_to_write() -> None:
    with pytest.raises(ValueError, match="lease was lost"):
        decide(StopReason.lease_lost, None, 0, **LIMITS)  # type: ignore[arg-type]


def test_the_runners_report_decides_when_nobody_stopped_it(tmp_path: Path) -> None:
    path = tmp_path / "attempt-1.json"
    RunnerReport(ok=True, result={"val/loss": 0.5}).write(path)
    done = decide(None, RunnerReport.read(path), 0, **LIMITS)  # type: ignore[arg-type]
    assert (done.status, done.result) == (JobStatus.succeeded, {"val/loss": 0.5})
    RunnerReport(ok=False, preempted="stopped at epoch 2").write(path)
    # A SIGTERM its worker did not send (the job may signal itself): retried from its
    # checkpoint, but an attempt is spent, or such a job would be taken again for ever.
    stopped = decide(None, RunnerReport.read(path), 1, **LIMITS)  # type: ignore[arg-type]
    assert (stopped.status, stopped.reason_code) == (JobStatus.failed, "preempted")
    assert stopped.retryable and not stopped.own
    asked = decide(StopReason.preempted, RunnerReport.read(path), 1, **LIMITS, preempted_by="x")  # type: ignore[arg-type]
    assert (asked.status, asked.reason_code) == (JobStatus.queued, "preempted")
    failed = decide(None, FAILED, 1, **LIMITS)  # type: ignore[arg-type]
    assert (failed.status, failed.reason_code, failed.retryable) == (
        JobStatus.failed,
        ReasonCode.error,
        True,
    )
    assert failed.reason_message == "ValueError: bad"


def test_a_runner_that_left_no_report_died_and_is_retried(tmp_path: Path) -> None:
    assert RunnerReport.read(tmp_path / "missing.json") is None
    (tmp_path / "half.json").write_text('{"ok": tr')
    assert RunnerReport.read(tmp_path / "half.json") is None
    died = decide(None, None, -signal.SIGKILL, **LIMITS)  # type: ignore[arg-type]
    assert (died.reason_code, died.retryable) == (ReasonCode.runner_died, True)
    assert died.reason_message == "runner killed by SIGKILL before reporting"


def test_an_unknown_reason_code_from_a_runner_is_stored_as_error() -> None:
    # A recipe may raise NotRetryable with a code of its own: the loop must not crash on it.
    report = RunnerReport(
        ok=False, error={"type": "E", "message": "m", "code": "my_code", "retryable": False}
    )
    outcome = decide(None, report, 1, **LIMITS)  # type: ignore[arg-type]
    assert (outcome.reason_code, outcome.retryable) == (ReasonCode.error, False)


def test_how_a_process_ended_reads_for_people_whatever_the_signal() -> None:
    assert how_it_ended(3) == "exited with 3"
    assert how_it_ended(-signal.SIGTERM) == "killed by SIGTERM"
    assert how_it_ended(-40) == "killed by signal 40"  # real-time: no name, no crash


def test_trainyards_own_failures_read_as_sentences_and_others_name_their_exception() -> None:
    """A NotRetryable's message was written for the user: the reason is that sentence.
    Any other exception's reason says which exception it was."""
    ours = NotRetryable(ReasonCode.requirements_failed, "pip install took longer than 20s")
    for exc, message in (
        (ours, "pip install took longer than 20s"),
        (ValueError("bad"), "builtins.ValueError: bad"),
    ):
        report = RunnerReport(ok=False, error=describe(exc))
        outcome = decide(None, report, 1, **LIMITS)  # type: ignore[arg-type]
        assert outcome.reason_message == message


def test_whose_failure_it_is_the_jobs_own_or_the_boxs() -> None:
    """The job's code raised: its own. A collective broken by a peer that went away, a
    rank killed from outside (no rank described a failure of its own), nodes that never
    met: not the job's, so retried while attempts are left."""
    from workers.ranks.strategies import RanksFailed
    from workers.runner.node import RendezvousFailed

    gone = RuntimeError("[gloo/transport/tcp/pair.cc:537] Read error: Connection reset by peer")
    cases = {
        ValueError("bad column"): True,
        FileNotFoundError(2, "No such file or directory"): True,
        gone: False,
        RanksFailed("rank 0 exited with 1; rank 1 killed by SIGKILL"): False,
        RendezvousFailed("node 1 never came"): False,
    }
    for exc, own in cases.items():
        outcome = decide(None, RunnerReport(ok=False, error=describe(exc)), 1, **LIMITS)  # type: ignore[arg-type]
        assert (outcome.own, outcome.retryable) == (own, True), exc


def test_out_of_memory_says_which_setting_to_lower() -> None:
    for exc, code, words in (
        (MemoryError(), ReasonCode.out_of_memory, "lower batch_size or the model's size"),
        (RuntimeError("CUDA out of memory. Tried"), ReasonCode.out_of_memory, "gpu_memory_gb"),
    ):
        outcome = decide(None, RunnerReport(ok=False, error=describe(exc)), 1, **LIMITS)  # type: ignore[arg-type]
        assert outcome.reason_code == code and words in outcome.reason_message
        assert not outcome.retryable
    cuda = {**describe(ValueError("CUDA out of memory")), "code": "cuda_oom", "retryable": False}
    outcome = decide(None, RunnerReport(ok=False, error=cuda), 1, **LIMITS)  # type: ignore[arg-type]
    assert "gpu_memory_gb" in outcome.reason_message and "batch_size" in outcome.reason_message
