"""How a failed attempt is described, and which failures are worth retrying."""

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


def _cuda_oom(exc: BaseException) -> bool:
    """Whether torch ran out of CUDA memory (torch is loaded wherever it could have: the
    supervisor, which describes its own failures too, never imports it)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(exc, torch.OutOfMemoryError)


class NotRetryable(Exception):
    """A failure another attempt cannot fix (bad params, out of memory)."""

    def __init__(self, code: ReasonCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def describe(exc: BaseException, rank: int | None = None) -> dict[str, Any]:
    """Type, message, traceback tail, reason code and whether a retry could help."""
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
    }


class Described(Exception):
    """A failure described in another process (the supervisor placing the job's inputs),
    raised again where the attempt's report is written."""

    def __init__(self, error: dict[str, Any]) -> None:
        super().__init__(error.get("message", ""))
        self.error = error
