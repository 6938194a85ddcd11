"""How an attempt on Slurm ended: Slurm's word on the job, the runners' reports and the
worker's own reason to stop it, made into the store's ``Outcome``. Where Slurm says
nothing a box would not (the job ran and its runner reported), ``workers.outcome.decide``
decides, as on a box."""

from __future__ import annotations

from service.models import JobStatus
from service.reasons import ReasonCode
from service.store import Outcome
from workers.outcome import RunnerReport, StopReason, decide
from workers.slurm.cluster import SlurmJob


def outcome(
    slurm_id: str,
    seen: SlurmJob | None,
    reports: list[RunnerReport],
    stop: StopReason | None,
    *,
    exit_code: str | None,
    timeout_s: int | None,
    stall_timeout_s: float,
    worker_id: str,
) -> Outcome:
    """The outcome of an attempt whose Slurm job ended (``seen``: its last state; None:
    Slurm no longer knows it). ``reports``: every node's runner report found."""
    report = leader(reports)
    state = None if seen is None else seen.state
    where = f"Slurm job {slurm_id}"
    if stop is None and not (report is not None and report.ok):
        if state == "PREEMPTED":  # the cluster wanted its nodes: no attempt spent
            return Outcome(
                JobStatus.queued,
                ReasonCode.preempted,
                f"{where} was preempted by Slurm; resumes from its last checkpoint",
            )
        if state == "TIMEOUT" and timeout_s is None and report is not None and report.preempted:
            # The partition's limit, not the job's: it checkpointed at Slurm's SIGTERM
            # (--signal), and a run longer than any partition allows goes on in the next
            # allocation, no attempt spent (each one trains further).
            return Outcome(
                JobStatus.queued,
                ReasonCode.preempted,
                f"{where} reached the partition's time limit; resumes from its checkpoint "
                f"({report.preempted})",
            )
        if state == "TIMEOUT":
            return Outcome(
                JobStatus.failed,
                ReasonCode.timeout,
                f"{where} reached its Slurm time limit (timeout_s={timeout_s})",
            )
        if state in ("NODE_FAIL", "BOOT_FAIL"):
            return Outcome(
                JobStatus.failed,
                ReasonCode.worker_lost,
                f"{where} ended {state} on {seen.nodes if seen else '?'}; retried",
                retryable=True,
            )
        if report is None:
            if seen is None:
                return Outcome(
                    JobStatus.failed,
                    ReasonCode.worker_lost,
                    f"{where} is no longer known to Slurm and left no report",
                    retryable=True,
                )
            return Outcome(
                JobStatus.failed,
                ReasonCode.runner_died,
                f"{where} ended {state} (exit {exit_code or '?'}) before its runner reported",
                retryable=True,
            )
    return decide(
        stop,
        report,
        0,
        timeout_s=timeout_s,
        stall_timeout_s=stall_timeout_s,
        worker_id=worker_id,
    )


def leader(reports: list[RunnerReport]) -> RunnerReport | None:
    """The report that ends the attempt: the leader's (global rank 0's node) if it left
    one, else a failing node's (its error says why), else None."""
    for report in reports:
        if report.leader:
            return report
    failed = [r for r in reports if not r.ok]
    return failed[0] if failed else None
