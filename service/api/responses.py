"""What the API answers besides success, declared once for the OpenAPI document.

Swagger and clients generated from /openapi.json know a route's answers only from its
``responses``. These are the ones the app really gives (the request guard, the token
check, FastAPI's body parsing, the handlers in ``service.api.errors``), each with the
``{"detail": ...}`` body it carries. The API routers take ``GUARDED``; a route adds
what its own work can answer.

Not declared: 400 for a Host header the server does not answer to. Every route gives it,
to a client pointed at the wrong name; no client handles it but by fixing the address.
"""

from __future__ import annotations

from typing import Any

from service.api.errors import RETRY_AFTER_S, ErrorDetail

Responses = dict[int | str, dict[str, Any]]


def error(description: str, **extra: Any) -> dict[str, Any]:
    """An error answer: what it means, and the ``{"detail": ...}`` body it carries."""
    return {"model": ErrorDetail, "description": description, **extra}


# Every route under /api/v1: the token comes first, and the database may be down.
GUARDED: Responses = {
    401: error(
        "Missing, wrong, revoked or expired token: send Authorization: Bearer <token>",
        headers={"WWW-Authenticate": {"schema": {"type": "string"}, "example": "Bearer"}},
    ),
    503: error(
        "The database is unavailable: try again after Retry-After seconds",
        headers={
            "Retry-After": {"schema": {"type": "integer"}, "example": RETRY_AFTER_S},
        },
    ),
}

# A POST, PUT or DELETE: what a browser sends from another site's page is refused.
WRITE: Responses = {
    403: error(
        "A write from another site's page (its Origin or Sec-Fetch-Site), or an action on "
        "another user's job: refused"
    ),
}

# A route that reads a JSON body.
JSON_BODY: Responses = {
    400: error("The body could not be read as JSON text (not UTF-8)"),
    413: error("The body is larger than TRAINYARD_MAX_BODY_BYTES"),
}

JOB_NOT_FOUND: Responses = {404: error("No job has this id")}
BLOB_NOT_FOUND: Responses = {404: error("No blob is stored under this digest")}

# A spec the catalog or the stored blobs refuse, past its types: one entry per field, or
# a sentence for a code package that is refused (its entry named).
SPEC_REFUSED: Responses = {
    422: error(
        "The request is invalid: its fields, or a spec the recipe catalog, the stored "
        "blobs or the code package refuse"
    ),
}

# A new job, submitted or rerun: admission refuses it past its owner's limit on queued jobs.
QUEUE_FULL: Responses = {
    429: error("You have as many jobs queued as your limit allows (Retry-After)"),
}
