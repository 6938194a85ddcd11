"""/healthz: liveness plus a database round trip (no auth: load balancers call it)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from sqlalchemy import text

from service.api.deps import EngineDep

router = APIRouter(tags=["health"])


@router.get("/healthz", summary="Liveness and database check")
def healthz(engine: EngineDep) -> JSONResponse:
    """200 when the database answers, 503 when it does not."""
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except Exception as exc:  # any driver error means "not healthy", with the reason
        return JSONResponse({"status": "error", "database": str(exc)[:200]}, status_code=503)
    return JSONResponse({"status": "ok", "database": "ok"})
