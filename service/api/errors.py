"""The one mapping from domain errors to HTTP answers."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from service.artifacts import ArtifactNotFound
from service.errors import (
    IdempotencyConflict,
    InvalidTransition,
    JobNotFound,
    SpecInvalid,
    TrainyardError,
)

STATUS_OF: dict[type[TrainyardError], int] = {
    JobNotFound: 404,
    ArtifactNotFound: 404,
    InvalidTransition: 409,
    IdempotencyConflict: 409,
    SpecInvalid: 422,
}


def install_error_handlers(app: FastAPI) -> None:
    """Answer domain errors as JSON {"detail": ...} with their status code."""

    async def handle(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, TrainyardError)
        code = next((c for t, c in STATUS_OF.items() if isinstance(exc, t)), 400)
        detail = exc.errors if isinstance(exc, SpecInvalid) else str(exc)
        return JSONResponse({"detail": detail}, status_code=code)

    app.add_exception_handler(TrainyardError, handle)
