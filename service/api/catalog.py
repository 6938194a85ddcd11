"""/api/v1/recipes and /api/v1/workers: what can run, and where."""

from __future__ import annotations

from fastapi import APIRouter

from service.api.deps import EngineDep, FreshCatalogDep, pooled
from service.api.responses import GUARDED
from service.catalog import list_workers
from service.db import read_session
from service.models import RecipeRead, WorkerRead

router = APIRouter(responses=GUARDED)


@router.get("/recipes", tags=["recipes"], summary="List recipes and their params schema")
def get_recipes(catalog: FreshCatalogDep) -> list[RecipeRead]:
    """Recipes the registered workers offer, each with the JSON schema of its params."""
    return sorted(catalog.recipes.values(), key=lambda r: r.name)


@router.get("/workers", tags=["workers"], summary="List workers, their devices and jobs")
@pooled
def get_workers(engine: EngineDep) -> list[WorkerRead]:
    """Workers with their devices, the jobs holding them, and heartbeat age."""
    with read_session(engine) as session:
        return list_workers(session)
