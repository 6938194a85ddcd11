"""Domain errors, raised below the API and mapped to HTTP in one handler (service/api/errors.py)."""

from __future__ import annotations

from typing import Any


class TrainyardError(Exception):
    """Base of every error a user can cause."""


class JobNotFound(TrainyardError):
    def __init__(self, job_id: int) -> None:
        super().__init__(f"job {job_id} not found")
        self.job_id = job_id


class InvalidTransition(TrainyardError):
    """A status change the state machine does not allow (e.g. cancel of a finished job)."""


class IdempotencyConflict(TrainyardError):
    """An Idempotency-Key reused with a different job spec."""


class SpecInvalid(TrainyardError):
    """A job spec that passed type checks but not the catalog (recipe, params, devices)."""

    def __init__(self, errors: list[dict[str, Any]]) -> None:
        super().__init__("; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in errors))
        self.errors = errors

    @classmethod
    def at(cls, loc: tuple[str | int, ...], msg: str, type_: str = "value_error") -> SpecInvalid:
        """One error at a field path, in FastAPI's validation-error shape."""
        return cls([{"loc": ["body", *loc], "msg": msg, "type": type_}])
