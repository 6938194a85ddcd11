"""Dependencies shared by the routers, as Annotated aliases tests can override."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy import Engine
from sqlmodel import Session

from service.catalog import Catalog, CatalogCache
from service.settings import Settings


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


def get_engine(request: Request) -> Engine:
    return request.app.state.engine


def get_session(engine: Annotated[Engine, Depends(get_engine)]) -> Iterator[Session]:
    with Session(engine, expire_on_commit=False) as session:
        yield session


def get_catalogs(request: Request) -> CatalogCache:
    return request.app.state.catalog


def get_catalog(request: Request, engine: Annotated[Engine, Depends(get_engine)]) -> Catalog:
    # Never holds a connection past this call: a submit then holds none while it waits for
    # the write lock (holding one there can exhaust the pool and deadlock).
    return request.app.state.catalog.get(engine)


SettingsDep = Annotated[Settings, Depends(get_settings)]


def get_fresh_catalog(request: Request, engine: Annotated[Engine, Depends(get_engine)]) -> Catalog:
    # As of now: a listing must show a worker that registered a moment ago.
    return request.app.state.catalog.get(engine, fresh=True)


CatalogDep = Annotated[Catalog, Depends(get_catalog)]
FreshCatalogDep = Annotated[Catalog, Depends(get_fresh_catalog)]
CatalogsDep = Annotated[CatalogCache, Depends(get_catalogs)]
EngineDep = Annotated[Engine, Depends(get_engine)]
SessionDep = Annotated[Session, Depends(get_session)]

_bearer = HTTPBearer(auto_error=False, description="TRAINYARD_API_TOKEN, when the server has one")


def require_token(
    settings: SettingsDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """401 unless the request carries the server's token (when it has one)."""
    if settings.api_token is None:
        return
    given = credentials.credentials if credentials else ""
    if not secrets.compare_digest(given.encode(), settings.api_token.encode()):
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            detail="missing or wrong token: send Authorization: Bearer <TRAINYARD_API_TOKEN>",
            headers={"WWW-Authenticate": "Bearer"},
        )


AuthDep = Depends(require_token)
