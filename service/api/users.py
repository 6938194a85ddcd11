"""/api/v1/me, /users, /tokens, /audit: who is signed in, the team's users and their
tokens (a token is shown once, when created), and the audit trail (admins)."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated

from fastapi import APIRouter, Path, Query, status

from service import audit, users
from service.api.deps import EngineDep, IdentityDep, PageLimit, PageOffset, pooled
from service.api.responses import GUARDED, JSON_BODY, WRITE, Responses, error
from service.audit import AuditPage
from service.db import read_session
from service.models import MAX_INT64, utcnow
from service.users import (
    Me,
    TokenCreate,
    TokenCreated,
    TokenRead,
    UserCreate,
    UserName,
    UserQuotas,
    UserRead,
)

router = APIRouter(tags=["users"], responses=GUARDED)

NOT_ADMIN: Responses = {403: error("Only an admin may do this (or the user themself, for tokens)")}
NO_USER: Responses = {404: error("No user has this name")}
Name = Annotated[UserName, Path(description="A user's name.")]


@router.get("/me", summary="Who your token signs you in as")
async def me(who: IdentityDep) -> Me:
    return Me(name=who.name, admin=who.admin)


@router.get("/users", summary="The box's users and their quotas")
@pooled
def list_users(engine: EngineDep) -> list[UserRead]:
    with read_session(engine) as session:
        return users.list_users(session)


@router.post(
    "/users",
    status_code=status.HTTP_201_CREATED,
    summary="Add a user (admins)",
    responses=WRITE | JSON_BODY | NOT_ADMIN | {409: error("A user has this name already")},
)
@pooled
def add_user(new: UserCreate, engine: EngineDep, who: IdentityDep) -> UserRead:
    return users.add_user(engine, who, new)


@router.patch(
    "/users/{name}/quotas",
    summary="Set a user's own quotas (admins); null: back to the default",
    responses=WRITE | JSON_BODY | NOT_ADMIN | NO_USER,
)
@pooled
def set_quotas(name: Name, quotas: UserQuotas, engine: EngineDep, who: IdentityDep) -> UserRead:
    return users.set_quotas(engine, who, name, quotas)


@router.post(
    "/users/{name}/tokens",
    status_code=status.HTTP_201_CREATED,
    summary="Create a token for a user (yourself, or anyone as an admin): shown once",
    responses=WRITE | JSON_BODY | NOT_ADMIN | NO_USER,
)
@pooled
def create_token(
    name: Name, engine: EngineDep, who: IdentityDep, body: TokenCreate | None = None
) -> TokenCreated:
    days = body.expires_in_days if body is not None else None
    expires_at = None if days is None else utcnow() + timedelta(days=days)
    return users.create_token(engine, who, name, expires_at)


@router.get(
    "/users/{name}/tokens",
    summary="A user's tokens, by prefix (never the tokens themselves)",
    responses=NOT_ADMIN,
)
@pooled
def list_tokens(name: Name, engine: EngineDep, who: IdentityDep) -> list[TokenRead]:
    with read_session(engine) as session:
        return users.list_tokens(session, who, name)


@router.post(
    "/tokens/{token_id}/revoke",
    summary="Revoke a token (your own, or anyone's as an admin): refused from now on",
    responses=WRITE | NOT_ADMIN | {404: error("No token has this id")},
)
@pooled
def revoke_token(
    token_id: Annotated[int, Path(ge=1, le=MAX_INT64)], engine: EngineDep, who: IdentityDep
) -> TokenRead:
    return users.revoke_token(engine, who, token_id)


@router.get("/audit", summary="Who did what, newest first (admins)", responses=NOT_ADMIN)
@pooled
def audit_trail(
    engine: EngineDep,
    who: IdentityDep,
    actor: Annotated[str | None, Query(max_length=64, description="One user's acts.")] = None,
    limit: PageLimit = 50,
    offset: PageOffset = 0,
) -> AuditPage:
    users.check_admin(who, "read the audit trail")
    with read_session(engine) as session:
        return audit.page(session, limit=limit, offset=offset, actor=actor)
