"""The job's own failures: how many so far, and what its reason says about them.

A job's own failure (its recipe raised, its script exited non-zero) would fail the same
way again: ``finish_attempt`` retries it only while the count is within the job's
``retries_on_error``. What is not the job's fault is retried up to ``max_attempts``.
"""

from __future__ import annotations

from typing import Any

from service.models import Job

# A reason is stored in at most this many characters (Job.reason_message).
REASON_MAX_CHARS = 2000

# The job's own failures so far, kept in its error (which every attempt's end carries on):
# retries_on_error counts them across the attempts that ended otherwise in between (a
# lost worker, a runner killed from outside, a handed-back or resumed attempt).
OWN_FAILURES = "own_failures"


def own_failures(job: Job) -> int:
    """How many of the job's attempts failed by its own code."""
    count = (job.error or {}).get(OWN_FAILURES, 0)
    return count if type(count) is int and count >= 0 else 0


def counted(error: dict[str, Any], own: int) -> dict[str, Any]:
    """The error, with the job's count of its own failures (whatever the runner said)."""
    error = {k: v for k, v in error.items() if k != OWN_FAILURES}
    return {**error, OWN_FAILURES: own} if own else error


def own_note(own: int, allowed: int) -> str:
    """What the reason adds about the job's own failures: retried, or why not."""
    if own > allowed:
        times = "" if own == 1 else f", {own} times"
        return f"the job's own error{times}; retries_on_error is {allowed}"
    return f"the job's own error; retry {own} of retries_on_error={allowed}"


def noted(message: str, note: str) -> str:
    """The message with ``note`` at the end of its first line (what follows it, a
    script's last lines on stderr, stays last), within the stored reason's length."""
    first, newline, rest = message.partition("\n")
    first = f"{first} ({note})"
    over = len(first) + len(newline) + len(rest) - REASON_MAX_CHARS
    if over > 0:  # the rest's last lines say most
        rest = rest[over:]
    return (first + newline + rest)[:REASON_MAX_CHARS]
