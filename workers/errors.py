"""How a failed attempt is described, and which failures are worth retrying."""

from __future__ import annotations

import sys
import traceback
from typing import Any

from service.reasons import ReasonCode
from workers.memory_limit import ran_out

TRACEBACK_LINES = 30


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
    elif ran_out(exc):  # past the job's memory limit (workers.memory_limit)
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
