"""/healthz: liveness, a database round trip, and the schema's revision (no auth: load
balancers call it)."""

from __future__ import annotations

import logging

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from service.api.deps import EngineDep
from service.migrate import schema_state

log = logging.getLogger(__name__)

router = APIRouter(tags=["health"])


@router.get(
    "/healthz",
    summary="Liveness, database and schema check",
    responses={
        503: {"description": "The database does not answer, or its schema is not this code's"}
    },
)
def healthz(engine: EngineDep) -> JSONResponse:
    """200 when the database answers at this code's schema revision; 503 when it does not
    answer, or its schema is behind (or ahead of) this code's."""
    try:
        with engine.connect() as conn:
            state = schema_state(conn)
    except Exception as exc:  # any driver error means "not healthy"
        # The driver's text names the host, port and user: for the log, not for anyone
        # who can reach this unauthenticated route.
        log.warning("health check: database unavailable: %s", str(exc).splitlines()[0][:300])
        return JSONResponse({"status": "error", "database": "unavailable"}, status_code=503)
    body = {
        "status": "ok" if state.current else "error",
        "database": "ok",
        "schema": {"revision": state.revision, "head": state.head},
    }
    problem = state.problem()
    if problem is not None:
        return JSONResponse({**body, "detail": problem}, status_code=503)
    return JSONResponse(body)
