"""Dependencies shared by the routers, as Annotated aliases tests can override.

Each is ``async def`` and runs on the event loop: FastAPI runs a plain ``def`` dependency
in its thread pool, a hop that cost a submit ~0.25 ms each under load (five of them made
most of its time). They do no I/O, or hand what blocks to the pool themselves. A route
that uses the database is a plain ``def`` opening its own session (``read_session``), so
the query and the session's close share one hop, and is wrapped in ``pooled``.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Annotated, ParamSpec, TypeVar

from fastapi import Depends, HTTPException, Query, Request, status
from fastapi.concurrency import run_in_threadpool
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy import Engine

from service.api.guard import MISSING_TOKEN
from service.blobs import BlobStore
from service.catalog import Catalog, CatalogCache
from service.models import MAX_INT64, NulFreeStr
from service.objects.store import ObjectStore
from service.settings import Settings
from service.users import Identity

# app.state is untyped (Starlette's State holds Any): each getter names the type it holds.


async def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


async def get_engine(request: Request) -> Engine:
    engine: Engine = request.app.state.engine
    return engine


async def get_catalogs(request: Request) -> CatalogCache:
    catalogs: CatalogCache = request.app.state.catalog
    return catalogs


async def get_catalog(request: Request) -> Catalog:
    # Queries (in the pool) only when the cache has expired; holds no connection past it.
    cache: CatalogCache = request.app.state.catalog
    catalog = cache.cached()
    if catalog is None:
        catalog = await run_in_threadpool(cache.get, request.app.state.engine)
    return catalog


async def get_fresh_catalog(request: Request) -> Catalog:
    # As of now: a listing must show a worker that registered a moment ago.
    cache: CatalogCache = request.app.state.catalog
    return await run_in_threadpool(cache.get, request.app.state.engine, fresh=True)


async def get_blob_store(request: Request) -> BlobStore:
    store: BlobStore = request.app.state.blobs
    return store


async def get_objects(request: Request) -> ObjectStore | None:
    # None unless TRAINYARD_STORAGE_URL is set (made in the lifespan).
    objects: ObjectStore | None = getattr(request.app.state, "objects", None)
    return objects


SettingsDep = Annotated[Settings, Depends(get_settings)]
ObjectsDep = Annotated[ObjectStore | None, Depends(get_objects)]
BlobStoreDep = Annotated[BlobStore, Depends(get_blob_store)]
CatalogDep = Annotated[Catalog, Depends(get_catalog)]
FreshCatalogDep = Annotated[Catalog, Depends(get_fresh_catalog)]
CatalogsDep = Annotated[CatalogCache, Depends(get_catalogs)]
EngineDep = Annotated[Engine, Depends(get_engine)]

_bearer = HTTPBearer(
    auto_error=False,
    description="A user's token (trainyard tokens create), or TRAINYARD_API_TOKEN (the admin's)",
)


async def get_identity(
    request: Request,
    _credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Identity:
    """Who the request acts for. RequestGuard resolved the token before the body was
    read (and refused it there if wrong); declared here so OpenAPI (and Swagger's
    Authorize) shows the scheme."""
    identity: Identity | None = getattr(request.state, "identity", None)
    if identity is None:  # a route outside the guarded paths: never grant anything
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            detail=MISSING_TOKEN,
            headers={"WWW-Authenticate": "Bearer"},
        )
    return identity


AuthDep = Depends(get_identity)
IdentityDep = Annotated[Identity, Depends(get_identity)]

# A listing's page and its owner filter, as every listing takes them.
PageLimit = Annotated[int, Query(ge=1, le=500)]
PageOffset = Annotated[int, Query(ge=0, le=MAX_INT64)]
OwnerFilter = Annotated[
    NulFreeStr | None, Query(max_length=64, description="A user's name, or me: your own.")
]


def owner_named(who: Identity, owner: str | None) -> str | None:
    """The owner a listing's filter names: ``me`` is whoever asks."""
    return who.name if owner == "me" else owner


P = ParamSpec("P")
T = TypeVar("T")


def pooled(endpoint: Callable[P, T]) -> Callable[P, Awaitable[T]]:
    """An endpoint that blocks (on the database), run in the thread pool from an async one.

    FastAPI runs a plain ``def`` endpoint in the pool, then validates what it returned in
    the pool again: two hops, where this makes one (the validation runs on the loop)."""

    @functools.wraps(endpoint)
    async def in_pool(*args: P.args, **kwargs: P.kwargs) -> T:
        return await run_in_threadpool(endpoint, *args, **kwargs)

    return in_pool
