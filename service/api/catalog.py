"""/api/v1/recipes and /api/v1/workers: what can run, and where."""

from __future__ import annotations

from fastapi import APIRouter

from service.api.deps import FreshCatalogDep, SessionDep
from service.catalog import list_workers
from service.models import RecipeRead, WorkerRead

router = APIRouter()


@router.get("/recipes", tags=["recipes"], summary="List recipes and their params schema")
def get_recipes(catalog: FreshCatalogDep) -> list[RecipeRead]:
    """Recipes the registered workers offer, each with the JSON schema of its params."""
    return sorted(catalog.recipes.values(), key=lambda r: r.name)


@router.get("/workers", tags=["workers"], summary="List workers, their devices and jobs")
def get_workers(session: SessionDep) -> list[WorkerRead]:
    """Workers with their devices, the jobs holding them, and heartbeat age."""
    return list_workers(session)
