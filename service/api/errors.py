"""The one mapping from domain errors to HTTP answers."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from sqlalchemy.exc import InterfaceError, InternalError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from service.artifacts import ArtifactNotFound
from service.errors import (
    BlobDigestMismatch,
    BlobInUse,
    BlobNotFound,
    BlobStorageFull,
    BlobTooLarge,
    IdempotencyConflict,
    InvalidTransition,
    JobNotFound,
    PackageInvalid,
    SpecInvalid,
    TrainyardError,
)

log = logging.getLogger(__name__)
RETRY_AFTER_S = 5

STATUS_OF: dict[type[TrainyardError], int] = {
    JobNotFound: 404,
    ArtifactNotFound: 404,
    InvalidTransition: 409,
    IdempotencyConflict: 409,
    SpecInvalid: 422,
    BlobNotFound: 404,
    BlobDigestMismatch: 400,
    BlobInUse: 409,
    BlobTooLarge: 413,
    BlobStorageFull: 507,
    PackageInvalid: 422,
}


def install_error_handlers(app: FastAPI) -> None:
    """Answer domain errors as JSON {"detail": ...} with their status code."""

    async def handle(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, TrainyardError)
        code = next((c for t, c in STATUS_OF.items() if isinstance(exc, t)), 400)
        detail = exc.errors if isinstance(exc, SpecInvalid) else str(exc)
        return JSONResponse({"detail": detail}, status_code=code)

    app.add_exception_handler(TrainyardError, handle)

    async def database_unavailable(_request: Request, exc: Exception) -> JSONResponse:
        # The pool pre-pings and replaces broken connections, so the next request after
        # the database is back succeeds: nothing to restart.
        log.warning("database unavailable: %s", str(exc).splitlines()[0][:200])
        return JSONResponse(
            {"detail": "the database is unavailable; try again in a few seconds"},
            status_code=503,
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )

    # OperationalError: cannot connect, connection lost; InterfaceError: connection already
    # closed; InternalError: e.g. the server ended an idle-in-transaction session;
    # PoolTimeout: no pooled connection came free in time.
    for unavailable in (OperationalError, InterfaceError, InternalError, PoolTimeout):
        app.add_exception_handler(unavailable, database_unavailable)
