"""How a failed attempt is described, which failures are worth retrying, and whose they
are: the job's own (its code raised or exited non-zero: retried only as its
``retries_on_error`` allows) or the box's (retried while attempts are left)."""

from __future__ import annotations

import errno
import re
import sys
import traceback
from typing import Any

from service.reasons import ReasonCode

TRACEBACK_LINES = 30

# A refused allocation, as it reads in an exception's text: torch's CPU allocator past
# the limit, CUDA's caching allocator past the GPU's memory, Python's own MemoryError.
_REFUSED = re.compile(r"\bMemoryError\b|can't allocate memory|CUDA out of memory")


# A collective that broke because a peer went away (killed, its box lost), as a survivor
# sees it: the peer's failure or the box's, not this rank's code. gloo raises a plain
# RuntimeError; NCCL's and the store's errors are torch's DistError.
_PEER_GONE = re.compile(
    r"Connection (?:reset|closed) by peer|NCCL communicator was aborted|DistNetworkError"
)

# What to change when a job runs out of GPU memory, or of its share of the box's.
GPU_ADVICE = (
    "lower batch_size or the model's size (its params), or give it more GPU memory (a "
    "larger gpu_memory_gb, or more devices with ddp)"
)
HOST_ADVICE = (
    "lower batch_size or the model's size (its params); its processes had their devices' "
    "share of the box's memory"
)


def ran_out(exc: BaseException) -> bool:
    """Whether a failure is an allocation that was refused: the same spec would run out
    again. torch has no type for it on the CPU: its allocator raises RuntimeError."""
    if isinstance(exc, MemoryError):
        return True
    if isinstance(exc, OSError) and exc.errno == errno.ENOMEM:
        return True
    return isinstance(exc, RuntimeError) and _REFUSED.search(str(exc)) is not None


def ran_out_in(stderr_tail: list[str]) -> bool:
    """Whether a program's last words on stderr are a refused allocation: a script's
    exception is not ours to inspect, only the last lines of its traceback (which, for
    DDP ranks, carry a "[rank N] " prefix)."""
    last = [line for line in stderr_tail if line.strip()][-3:]
    return any(_REFUSED.search(line) for line in last)


def oom_advice(code: ReasonCode, said: str) -> str | None:
    """Which settings to lower, for a failure that ran out of memory (``said``: its words,
    which tell a GPU's from the box's where a script's code does not); else None."""
    if code == ReasonCode.cuda_oom or (code == ReasonCode.out_of_memory and "CUDA" in said):
        return GPU_ADVICE
    return HOST_ADVICE if code == ReasonCode.out_of_memory else None


def peer_gone(exc: BaseException) -> bool:
    """Whether a rank failed because another one went away (see ``_PEER_GONE``)."""
    dist = sys.modules.get("torch.distributed")
    dist_error = getattr(dist, "DistError", None) if dist is not None else None
    if dist_error is not None and isinstance(exc, dist_error):
        return True
    return _PEER_GONE.search(str(exc)) is not None


def peer_gone_in(stderr_tail: list[str]) -> bool:
    """Whether a program's last words on stderr are a collective broken by a peer."""
    last = [line for line in stderr_tail if line.strip()][-3:]
    return any(_PEER_GONE.search(line) for line in last)


def _cuda_oom(exc: BaseException) -> bool:
    """Whether torch ran out of CUDA memory (torch is loaded wherever it could have: the
    supervisor, which describes its own failures too, never imports it)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(exc, torch.OutOfMemoryError)


class NotTheJobs(Exception):
    """A failure of the box or of the attempt's machinery, not of the job's code (a rank
    killed from outside, the job's inputs that could not be placed): worth another
    attempt whatever the job's ``retries_on_error``."""


class NotRetryable(Exception):
    """A failure another attempt cannot fix (bad params, out of memory)."""

    def __init__(self, code: ReasonCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def describe(exc: BaseException, rank: int | None = None) -> dict[str, Any]:
    """Type, message, traceback tail, reason code, whether a retry could help and whether
    the failure is the job's own."""
    code, retryable = ReasonCode.error, True
    if isinstance(exc, NotRetryable):
        code, retryable = exc.code, False
    elif _cuda_oom(exc):
        code, retryable = ReasonCode.cuda_oom, False
    elif ran_out(exc):  # past the job's memory limit (workers.runner.limits)
        code, retryable = ReasonCode.out_of_memory, False
    tb = "".join(traceback.format_exception(exc)).splitlines()
    return {
        "type": f"{type(exc).__module__}.{type(exc).__qualname__}",
        "message": str(exc)[:2000],
        # A NotRetryable's message is a sentence for the user: the reason shows it alone.
        "plain": isinstance(exc, NotRetryable),
        "traceback": tb[-TRACEBACK_LINES:],
        "rank": rank,
        "code": code,  # a StrEnum: JSON holds its value, as before
        "retryable": retryable,
        # the job's own failure, or the box's (NotTheJobs) or a peer's, seen from a rank
        "own": not isinstance(exc, NotTheJobs) and not peer_gone(exc),
    }


class Described(Exception):
    """A failure described in another process (the supervisor placing the job's inputs),
    raised again where the attempt's report is written."""

    def __init__(self, error: dict[str, Any]) -> None:
        super().__init__(error.get("message", ""))
        self.error = error
