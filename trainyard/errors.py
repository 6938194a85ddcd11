"""What can go wrong talking to a Trainyard server, as exceptions.

Every error answer of the API becomes an ``ApiError`` of the class its status code names,
carrying the server's ``detail`` (a sentence, or for a refused spec the list of fields
and why). A server that cannot be reached is ``Unreachable``.
"""

from __future__ import annotations

from typing import Any

import httpx


class TrainyardError(Exception):
    """Anything the client raises."""


class Unreachable(TrainyardError):
    """The server did not answer (refused, timed out, dropped the connection)."""


class WaitTimeout(TrainyardError, TimeoutError):
    """``Job.wait(timeout=...)`` ran out before the job finished."""


class ApiError(TrainyardError):
    """The server answered with an error: ``status_code`` and its ``detail``."""

    def __init__(self, status_code: int, detail: Any, response: httpx.Response | None = None):
        self.status_code = status_code
        self.detail = detail
        self.response = response
        super().__init__(f"{status_code}: {describe(detail)}")


class BadRequest(ApiError):
    """400: the request was malformed (a blob whose bytes do not match its digest, say)."""


class Unauthorized(ApiError):
    """401: no token, or one the server does not know (revoked, expired)."""


class Forbidden(ApiError):
    """403: signed in, but not allowed (another user's job, an admin's action)."""


class NotFound(ApiError):
    """404: no such job, sweep, blob, artifact, user or webhook."""


class Conflict(ApiError):
    """409: the state forbids it (cancelling a finished job, a blob in use)."""


class TooLarge(ApiError):
    """413: an upload over the server's limit."""


class Invalid(ApiError):
    """422: the spec (or another body) was refused; ``detail`` says which field and why."""


class QuotaExceeded(ApiError):
    """429: a quota is reached (queued jobs, open event streams); ``retry_after`` seconds."""

    @property
    def retry_after(self) -> float | None:
        return retry_after(self.response) if self.response is not None else None


class Unavailable(ApiError):
    """503: the server cannot serve now (its database is down); retried before raised."""


ERRORS: dict[int, type[ApiError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    413: TooLarge,
    422: Invalid,
    429: QuotaExceeded,
    503: Unavailable,
}


def error_of(response: httpx.Response) -> ApiError:
    """The exception for an error answer (its body must have been read)."""
    try:
        body = response.json()
    except ValueError:
        body = response.text
    detail = body.get("detail", body) if isinstance(body, dict) else body
    return ERRORS.get(response.status_code, ApiError)(response.status_code, detail, response)


def describe(detail: Any) -> str:
    """A detail as one line: a refused spec's fields as ``field: why; ...``."""
    if isinstance(detail, list):
        return "; ".join(
            f"{'.'.join(map(str, d.get('loc', [])[1:]))}: {d.get('msg')}"
            if isinstance(d, dict)
            else str(d)
            for d in detail
        )
    return str(detail)


def retry_after(response: httpx.Response) -> float | None:
    """The ``Retry-After`` header in seconds (a number; dates are not sent by Trainyard)."""
    value = response.headers.get("Retry-After", "")
    try:
        return max(0.0, float(value))
    except ValueError:
        return None
