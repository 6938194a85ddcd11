"""The one mapping from domain errors to HTTP answers."""

from __future__ import annotations

import logging
from typing import Any, get_args

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.encoders import jsonable_encoder
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import iter_route_contexts
from pydantic import BaseModel, Field
from sqlalchemy.exc import SQLAlchemyError
from starlette.exceptions import HTTPException
from starlette.routing import Match

from service.artifacts import ArtifactNotFound
from service.catalog import CatalogCache, params_beside
from service.db import DATABASE_UNAVAILABLE
from service.errors import (
    BlobDigestMismatch,
    BlobInUse,
    BlobNotFound,
    BlobStorageFull,
    BlobTooLarge,
    IdempotencyConflict,
    InvalidTransition,
    JobNotFound,
    NotAllowed,
    PackageInvalid,
    QueueQuotaReached,
    SpecInvalid,
    SweepNotFound,
    TokenNotFound,
    TrainyardError,
    UserExists,
    UserNotFound,
    WebhookNotFound,
)
from service.jobspec import unknown_field
from service.models import JobCreate
from service.points import finite_json

log = logging.getLogger(__name__)
RETRY_AFTER_S = 5
QUEUE_RETRY_AFTER_S = 60


class FieldError(BaseModel):
    """One field at fault in a request, in FastAPI's validation-error shape (which may add
    ``input`` and ``ctx``)."""

    loc: list[str | int] = Field(
        description="Where: body, query, path or header, then the path to the field.",
        examples=[["body", "params", "hidden"]],
    )
    msg: str = Field(description="Why it is refused.", examples=["Input should be > 0"])
    type: str = Field(description="The kind of error.", examples=["greater_than"])


# The handlers below, FastAPI's validation errors, the token check and the request guard
# all write this shape; service/api/responses.py declares it for each route.
class ErrorDetail(BaseModel):
    """The body of every error answer."""

    detail: str | list[FieldError] = Field(
        description="What went wrong: a sentence, or for a refused request one entry per "
        "field at fault.",
        examples=["job 7 not found"],
    )


STATUS_OF: dict[type[TrainyardError], int] = {
    JobNotFound: 404,
    SweepNotFound: 404,
    WebhookNotFound: 404,
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
    NotAllowed: 403,
    UserNotFound: 404,
    UserExists: 409,
    TokenNotFound: 404,
    QueueQuotaReached: 429,
}


def install_error_handlers(app: FastAPI) -> None:
    """Answer domain errors as JSON {"detail": ...} with their status code."""

    async def handle(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, TrainyardError)
        code = next((c for t, c in STATUS_OF.items() if isinstance(exc, t)), 400)
        detail = exc.errors if isinstance(exc, SpecInvalid) else str(exc)
        # A full queue drains as jobs start: a client may try again in a while.
        headers = {"Retry-After": str(QUEUE_RETRY_AFTER_S)} if code == 429 else None
        return JSONResponse({"detail": detail}, status_code=code, headers=headers)

    app.add_exception_handler(TrainyardError, handle)

    async def invalid_request(request: Request, exc: Exception) -> JSONResponse:
        # FastAPI's own 422, with the refused input's numbers made JSON: a NaN or Infinity
        # in a body (Python's json reads them) made the answer itself fail, a 500.
        assert isinstance(exc, RequestValidationError)
        model = _body_model(request)
        errors = [_hinted(e, model) for e in exc.errors()]
        if model is JobCreate:  # the params too: every problem of a spec in one answer
            errors += await _params_beside(request, exc.body)
        detail = finite_json(jsonable_encoder(errors))
        return JSONResponse({"detail": detail}, status_code=422)

    app.add_exception_handler(RequestValidationError, invalid_request)

    async def database_unavailable(_request: Request, exc: Exception) -> JSONResponse:
        # The pool pre-pings and replaces broken connections, so the next request after
        # the database is back succeeds: nothing to restart.
        log.warning("database unavailable: %s", str(exc).splitlines()[0][:200])
        return JSONResponse(
            {"detail": "the database is unavailable; try again in a few seconds"},
            status_code=503,
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )

    for unavailable in DATABASE_UNAVAILABLE:
        app.add_exception_handler(unavailable, database_unavailable)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        if exc.status_code == 405:
            # Starlette answers from the first route whose path matched, which knows only
            # its own method: Allow must name every method the path has (RFC 9110).
            allow = ", ".join(sorted(methods_of_path(app, request)))
            exc.headers = {**(exc.headers or {}), "Allow": allow}
        return await http_exception_handler(request, exc)

    app.add_exception_handler(HTTPException, http_error)


def _body_model(request: Request) -> type[BaseModel] | None:
    """The model of the request's JSON body, where its route has one."""
    body_field = getattr(request.scope.get("route"), "body_field", None)
    annotation = getattr(getattr(body_field, "field_info", None), "annotation", None)
    for model in (annotation, *get_args(annotation)):  # TokenCreate | None
        if isinstance(model, type) and issubclass(model, BaseModel):
            return model
    return None


def _hinted(error: Any, model: type[BaseModel] | None) -> Any:
    """A body's unknown top-level field told the field names close to it."""
    loc = error.get("loc", ())
    if error.get("type") != "extra_forbidden" or model is None or len(loc) != 2:
        return error
    return {**error, "msg": unknown_field(str(loc[1]), model.model_fields)}


async def _params_beside(request: Request, body: Any) -> list[dict[str, Any]]:
    """The errors of a refused spec's params (``catalog.params_beside``), from the
    catalog as the submit would read it; none if the database cannot say now."""
    catalogs: CatalogCache = request.app.state.catalog
    catalog = catalogs.cached()
    if catalog is None:
        try:
            catalog = await run_in_threadpool(catalogs.get, request.app.state.engine)
        except SQLAlchemyError:  # the fields' errors still stand on their own
            return []
    return params_beside(catalog, body)


def methods_of_path(app: FastAPI, request: Request) -> set[str]:
    """Every method some route of the app answers on this request's path."""
    methods: set[str] = set()
    for route in iter_route_contexts(app.routes):  # an included router's routes too
        match, _ = route.matches(request.scope)
        if match is not Match.NONE:
            methods |= route.methods or set()
    return methods
