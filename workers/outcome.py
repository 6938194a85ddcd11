"""How an attempt ended: the runner's own report, the supervisor's reason to stop it, and
the one function that turns both into the store's ``Outcome``."""

from __future__ import annotations

import dataclasses
import json
import signal
from dataclasses import asdict, dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter

from service.models import JobStatus
from service.points import finite_json, finite_values, storable_text
from service.reasons import ReasonCode
from service.store import Outcome
from service.store.retries import REASON_MAX_CHARS
from workers.errors import oom_advice
from workers.jobfiles import write_atomic

# A failed script's reason ends with this many of its last lines on stderr.
STDERR_REASON_LINES = 10


class StopReason(StrEnum):
    """Why the supervisor stopped an attempt (it then decides the outcome, not the runner)."""

    cancel = "cancel"  # the user cancelled the job
    timeout = "timeout"  # the attempt ran past the job's timeout_s
    stalled = "stalled"  # no training step for stall_timeout_s
    shutdown = "shutdown"  # the worker is stopping; the job goes back to the queue
    preempted = "preempted"  # stopped for a job that outranks it; back to the queue
    lease_lost = "lease_lost"  # the job may be another worker's: nothing more is written
    node_lost = "node_lost"  # a job across boxes lost another node: every node stops


@dataclass(frozen=True)
class RunnerReport:
    """What the runner leaves in ``.runner/attempt-<n>.json`` as it exits."""

    ok: bool
    result: dict[str, float] | None = None  # final metrics, when ok
    preempted: str | None = None  # where it stopped after a SIGTERM, with a checkpoint
    error: dict[str, Any] | None = None  # workers.errors.describe() of the failure
    # A job across boxes: whether global rank 0 trained here. Only that node's report
    # (its result) ends the job; the others' ranks ending well ends their part only.
    leader: bool = True

    def write(self, path: Path) -> None:
        write_atomic(path, json.dumps(asdict(self)))

    @classmethod
    def read(cls, path: Path) -> RunnerReport | None:
        """The report, or None when the runner died before writing it."""
        try:
            return cls.parse(path.read_bytes())
        except OSError:
            return None

    @classmethod
    def parse(cls, data: bytes) -> RunnerReport | None:
        """The report these bytes hold, or None when they hold none. The runner runs
        beside the job's code, which can write this file too: its types are checked, and
        numbers that are not finite become null (the store's JSON refuses NaN)."""
        try:
            report = _REPORT.validate_python(json.loads(data))
        except (ValueError, TypeError, RecursionError):  # ValidationError is a ValueError
            return None
        if report.error is None:
            return report
        return dataclasses.replace(report, error=finite_json(report.error))


_REPORT = TypeAdapter(RunnerReport)


def decide(
    stop: StopReason | None,
    report: RunnerReport | None,
    returncode: int,
    *,
    timeout_s: int | None,
    stall_timeout_s: float,
    worker_id: str,
    preempted_by: str | None = None,
    lost_node: str | None = None,
) -> Outcome:
    """The outcome of an attempt whose processes are all gone.

    A stop the supervisor asked for decides it whatever the runner said (but a job
    preempted that had just finished has succeeded); then the runner's report; with
    neither, the runner died (retried: the box may be at fault). ``preempted_by``: who
    the attempt was stopped for, in words; ``lost_node``: which other node of a job
    across boxes went silent.
    """
    if stop == StopReason.lease_lost:
        raise ValueError("an attempt whose lease was lost has no outcome to record")
    if stop == StopReason.cancel:
        return Outcome(JobStatus.cancelled, ReasonCode.cancelled, "cancelled while running")
    if stop == StopReason.timeout:
        return Outcome(
            JobStatus.failed, ReasonCode.timeout, f"attempt exceeded timeout_s={timeout_s}"
        )
    if stop == StopReason.stalled:
        return Outcome(
            JobStatus.failed,
            ReasonCode.stalled,
            f"no training step for {stall_timeout_s:.0f}s; stopped",
            retryable=True,
        )
    if stop == StopReason.node_lost:
        return Outcome(
            JobStatus.failed,
            ReasonCode.worker_lost,
            f"{lost_node} stopped renewing its lease; every node stopped",
            retryable=True,
        )
    if stop == StopReason.shutdown:
        return Outcome(
            JobStatus.queued,
            ReasonCode.worker_shutdown,
            f"worker {worker_id} shut down; the job resumes from its last checkpoint",
        )
    if stop == StopReason.preempted and not (report is not None and report.ok):
        return Outcome(
            JobStatus.queued,
            ReasonCode.preempted,
            f"preempted by {preempted_by}; resumes from its last checkpoint",
        )
    if report is None:
        how = how_it_ended(returncode)
        return Outcome(
            JobStatus.failed,
            ReasonCode.runner_died,
            f"runner {how} before reporting",
            retryable=True,
        )
    if report.ok:
        # A diverged job's final metrics are NaN: null, as in its points (service.points).
        result = None if report.result is None else finite_values(report.result)
        return Outcome(JobStatus.succeeded, ReasonCode.succeeded, "trained", result=result)
    if report.preempted is not None:
        # A SIGTERM its worker did not send (someone on the box, or the job's own code): it
        # checkpointed and stopped. Retried from there, but an attempt is spent: handed
        # back free, a job that signals itself would be taken again at once, for ever.
        return Outcome(
            JobStatus.failed,
            ReasonCode.preempted,
            f"stopped by a SIGTERM its worker did not send ({report.preempted}); resumes "
            "from its checkpoint",
            retryable=True,
            own=False,
        )
    error = report.error or {}
    ranks = f" ({error['ranks']})" if error.get("ranks") else ""
    said = str(error.get("message"))
    if not error.get("plain"):  # an exception's own words: say whose
        said = f"{error.get('type')}: {said}"
    said = f"{said}{ranks}"
    code = _reason(error.get("code"))
    advice = oom_advice(code, f"{said} {error.get('stderr')}")
    if advice is not None:  # which setting to lower, where the job's reason is read
        said = f"{said}: {advice}"
    return Outcome(
        JobStatus.failed,
        code,
        reason_text(said, error.get("stderr")),
        error=error,
        retryable=bool(error.get("retryable", True)),
        # a report from before ``own`` was said: the job's code raised
        own=bool(error.get("own", True)),
    )


def reason_text(said: str, stderr: object = None) -> str:
    """A failure's reason: what happened, then the last lines the failing process wrote on
    stderr (a script's cause, ``SyntaxError: expected ':'``, is there and nowhere else),
    as many of the last as fit in the stored reason."""
    first = said.replace("\n", " ")[:REASON_MAX_CHARS]
    lines = (
        [str(line) for line in stderr][-STDERR_REASON_LINES:] if isinstance(stderr, list) else []
    )
    while lines and len(first) + sum(len(line) + 1 for line in lines) > REASON_MAX_CHARS:
        lines.pop(0)  # the last lines say most: the error comes at the end
    return storable_text("\n".join([first, *lines])[:REASON_MAX_CHARS])


def _reason(code: str | None) -> ReasonCode:
    """The code a runner reported; an unknown one (a recipe's own NotRetryable code, a
    report from another version) is stored as ``error`` rather than stopping the loop."""
    try:
        return ReasonCode(str(code))
    except ValueError:
        return ReasonCode.error


def how_it_ended(returncode: int | None) -> str:
    """ "exited with 1", "killed by SIGKILL" (subprocess's convention: -N is signal N)."""
    if returncode is None or returncode >= 0:
        return f"exited with {returncode}"
    try:
        return f"killed by {signal.Signals(-returncode).name}"
    except ValueError:  # a real-time signal has no name
        return f"killed by signal {-returncode}"
