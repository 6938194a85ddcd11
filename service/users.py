"""Who is asking: users, their API tokens, and the rule of who may act on what.

A token is ``ty_`` and 43 characters of ``secrets.token_urlsafe(32)``: 256 random bits.
Only its SHA-256 is stored (with its first characters, to tell tokens apart), so the
table cannot give a token back. A fast hash is enough for a secret that cannot be
guessed (a slow password hash would cost every request milliseconds and protect nothing
more); GitHub stores its tokens the same way. ``TRAINYARD_API_TOKEN`` stays the
bootstrap admin's token: an admin adds users and gives them tokens.

One module past ~300 lines: the user and token schemas, the rules of who may act on
what, and the token lookup (with its cache) are one answer to "who is asking, and may
they?"; the routes are in ``api/users.py``, the quotas' SQL in ``store/usage.py``.
"""

from __future__ import annotations

import hashlib
import secrets
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, NamedTuple

from pydantic import StrictBool, StringConstraints
from sqlalchemy import Engine
from sqlmodel import Field, Session, SQLModel, col, select

from service import audit
from service.audit import Action
from service.db import read_session, write_session
from service.errors import NotAllowed, QueueQuotaReached, TokenNotFound, UserExists, UserNotFound
from service.models import BOOTSTRAP_USER, ApiToken, IntOrNone, JobCreate, User, utcnow
from service.settings import Settings

TOKEN_PREFIX = "ty_"
SHOWN_CHARS = len(TOKEN_PREFIX) + 6  # the part of a token listings show
UserName = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_.-]{0,63}$")]
# A token resolved once is trusted this long by the API process that resolved it: a
# revoke made through another API process is refused after this at the latest (through
# this one, at once).
IDENTITY_TTL_S = 1.0
OWN_LIMITS_TTL_S = 2.0  # as for tokens: a change through this API process counts at once


@dataclass(frozen=True)
class Identity:
    """The user a request acts as."""

    name: str
    admin: bool


BOOTSTRAP = Identity(BOOTSTRAP_USER, admin=True)


class UserCreate(SQLModel):
    name: UserName = Field(description="Lower-case letters, digits, '_', '.', '-'.")
    admin: StrictBool = False


class UserQuotas(SQLModel):
    """An admin's change to a user's own limits: the fields given change; one given as
    null goes back to the settings' default."""

    max_running_devices: IntOrNone = Field(None, ge=1, le=1_000_000)
    max_queued_jobs: IntOrNone = Field(None, ge=1, le=100_000_000)


class UserRead(SQLModel):
    name: str
    admin: bool
    created_at: datetime
    max_running_devices: int | None = Field(description="Own limit; null: the default.")
    max_queued_jobs: int | None = Field(description="Own limit; null: the default.")


class Me(SQLModel):
    name: str
    admin: bool


class TokenCreate(SQLModel):
    expires_in_days: IntOrNone = Field(
        None, ge=1, le=3650, description="Refused after this many days; null: never."
    )


class TokenRead(SQLModel):
    id: int
    user: str
    prefix: str = Field(description="The token's first characters, to tell it apart.")
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None

    @classmethod
    def of(cls, token: ApiToken) -> TokenRead:
        assert token.id is not None
        return cls(
            id=token.id,
            user=token.user_name,
            prefix=token.prefix,
            created_at=token.created_at,
            expires_at=token.expires_at,
            revoked_at=token.revoked_at,
        )


class TokenCreated(TokenRead):
    token: str = Field(description="The token itself: shown this once, never again.")


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


# --- who may do what -----------------------------------------------------------------


def check_may_act(who: Identity, owner: str, what: str) -> None:
    """Everyone sees every job; only its owner, or an admin, acts on it."""
    if not (who.admin or who.name == owner):
        raise NotAllowed(f"{what} is {owner}'s: only {owner} or an admin may do that")


def check_admin(who: Identity, what: str) -> None:
    if not who.admin:
        raise NotAllowed(f"only an admin may {what} (you are {who.name})")


def check_spec_rights(who: Identity, spec: JobCreate) -> None:
    """What only an admin may ask of a job: that it is never preempted."""
    if not spec.preemptible:
        check_admin(who, "submit a job that is never preempted (preemptible: false)")


def queue_limit(
    own_limits: dict[str, int], owner: str, settings: Settings
) -> tuple[int, str] | None:
    """The owner's limit on queued jobs, and where it is set; None without one.
    ``own_limits``: users' own (``OWN_LIMITS``), read at most every OWN_LIMITS_TTL_S, so
    a submit asks no query where no limit applies."""
    own = own_limits.get(owner)
    if own is not None:
        return own, f"{owner}'s own limit"
    if settings.max_queued_jobs_per_user is not None:
        return settings.max_queued_jobs_per_user, "TRAINYARD_MAX_QUEUED_JOBS_PER_USER"
    return None


def check_queue_quota(owner: str, queued: int, limit: tuple[int, str]) -> None:
    """Refuse a submit past the owner's limit on queued jobs (``queue_limit``), given how
    many they have queued (``store.queued_count``). An early word only: the limit holds
    because the insert counts again in its own transaction (``service.store.submit``)."""
    if queued >= limit[0]:
        raise QueueQuotaReached(owner, queued, *limit)


class OwnLimits:
    """Users' own limits on queued jobs, read at most every OWN_LIMITS_TTL_S."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._read_at = float("-inf")
        self._limits: dict[str, int] = {}

    def cached(self) -> dict[str, int] | None:
        """The limits if read within OWN_LIMITS_TTL_S (no query); else None."""
        with self._lock:
            fresh = time.monotonic() - self._read_at < OWN_LIMITS_TTL_S
            return self._limits if fresh else None

    def get(self, engine: Engine) -> dict[str, int]:
        now = time.monotonic()
        limits = self.cached()
        if limits is not None:
            return limits
        with read_session(engine) as session:
            rows = session.exec(
                select(User.name, User.max_queued_jobs).where(
                    col(User.max_queued_jobs).is_not(None)
                )
            ).all()
        with self._lock:
            self._limits = {name: int(limit) for name, limit in rows if limit is not None}
            self._read_at = now
            return self._limits

    def forget(self) -> None:
        with self._lock:
            self._read_at = float("-inf")


OWN_LIMITS = OwnLimits()


# --- users ---------------------------------------------------------------------------


def add_user(engine: Engine, who: Identity, new: UserCreate) -> UserRead:
    check_admin(who, "add users")
    with write_session(engine) as session:
        if session.get(User, new.name) is not None:
            raise UserExists(new.name)
        user = User(name=new.name, admin=new.admin)
        session.add(user)
        audit.record(session, who.name, Action.user_added, new.name, admin=new.admin)
        session.flush()
        return _read(user)


def set_quotas(engine: Engine, who: Identity, name: str, change: UserQuotas) -> UserRead:
    check_admin(who, "change users' quotas")
    given = change.model_dump(include=change.model_fields_set)
    with write_session(engine) as session:
        user = session.get(User, name, with_for_update=True)
        if user is None:
            raise UserNotFound(name)
        for field, value in given.items():
            setattr(user, field, value)
        audit.record(session, who.name, Action.user_changed, name, **given)
        session.flush()
        read = _read(user)
    OWN_LIMITS.forget()
    return read


def list_users(session: Session) -> list[UserRead]:
    users = session.exec(select(User).order_by(col(User.name))).all()
    return [_read(u) for u in users]


def _read(user: User) -> UserRead:
    return UserRead.model_validate(user, from_attributes=True)


# --- tokens --------------------------------------------------------------------------


def create_token(
    engine: Engine, who: Identity, name: str, expires_at: datetime | None
) -> TokenCreated:
    """A new token for ``name`` (an admin's act, or the user's own)."""
    if who.name != name:
        check_admin(who, f"create tokens for {name}")
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    with write_session(engine) as session:
        if session.get(User, name) is None:
            raise UserNotFound(name)
        row = ApiToken(
            user_name=name,
            prefix=token[:SHOWN_CHARS],
            token_hash=hash_token(token),
            expires_at=expires_at,
            revoked_at=None,
        )
        session.add(row)
        session.flush()
        audit.record(session, who.name, Action.token_created, name, token_id=row.id,
                     prefix=row.prefix)  # fmt: skip
        return TokenCreated(**TokenRead.of(row).model_dump(), token=token)


def list_tokens(session: Session, who: Identity, name: str) -> list[TokenRead]:
    if who.name != name:
        check_admin(who, f"list {name}'s tokens")
    rows = session.exec(
        select(ApiToken).where(col(ApiToken.user_name) == name).order_by(col(ApiToken.id))
    )
    return [TokenRead.of(t) for t in rows]


def revoke_token(engine: Engine, who: Identity, token_id: int) -> TokenRead:
    """Revoke a token (its user's act, or an admin's); idempotent."""
    with write_session(engine) as session:
        token = session.get(ApiToken, token_id, with_for_update=True)
        if token is None:
            raise TokenNotFound(token_id)
        if who.name != token.user_name:
            check_admin(who, f"revoke {token.user_name}'s tokens")
        if token.revoked_at is None:
            token.revoked_at = utcnow()
            audit.record(session, who.name, Action.token_revoked, token.user_name,
                         token_id=token_id, prefix=token.prefix)  # fmt: skip
        session.flush()
        read = TokenRead.of(token)
    IDENTITIES.forget(token.token_hash)
    return read


def identify(engine: Engine, token: str) -> Identity | None:
    """The user a token belongs to, if it is neither revoked nor expired."""
    now = utcnow()
    with read_session(engine) as session:
        row = session.exec(
            select(User.name, User.admin)
            .join(ApiToken, col(ApiToken.user_name) == col(User.name))
            .where(
                col(ApiToken.token_hash) == hash_token(token),
                col(ApiToken.revoked_at).is_(None),
                (col(ApiToken.expires_at).is_(None)) | (col(ApiToken.expires_at) > now),
            )
        ).first()
    return None if row is None else Identity(row[0], bool(row[1]))


class IdentityCache:
    """Tokens resolved a moment ago (IDENTITY_TTL_S), so a burst of requests does not
    query the token table each time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[str, tuple[float, Identity | None]] = {}

    def cached(self, token: str) -> Identity | None:
        """The user of a token resolved within IDENTITY_TTL_S; else None."""
        with self._lock:
            hit = self._entries.get(hash_token(token))
        if hit is not None and time.monotonic() - hit[0] < IDENTITY_TTL_S:
            return hit[1]
        return None

    def get(self, engine: Engine, token: str) -> Identity | None:
        """The token's user, asking the token table (None: unknown, revoked or expired)."""
        key = hash_token(token)
        now = time.monotonic()
        found = identify(engine, token)
        with self._lock:
            if len(self._entries) > 10_000:  # made-up tokens must not grow it forever
                self._entries.clear()
            self._entries[key] = (now, found)
        return found

    def forget(self, key: str) -> None:
        with self._lock:
            self._entries.pop(key, None)


IDENTITIES = IdentityCache()


class Lookup(NamedTuple):
    """A user's token that the token table must be asked about."""

    token: str


def bearer(authorization: str | None) -> str:
    """The token of an ``Authorization: Bearer <token>`` header, or ""."""
    scheme, _, given = (authorization or "").partition(" ")
    return given.strip() if scheme.lower() == "bearer" else ""


def resolve(settings: Settings, authorization: str | None) -> Identity | Lookup | None:
    """Who a request's ``Authorization`` header says it is, where that needs no query: the
    bootstrap admin (TRAINYARD_API_TOKEN, compared in constant time; or, on a server
    without one, any request that brings no user's token), a user's token resolved a
    moment ago, or nobody (None: 401). A user's token not seen lately is a ``Lookup``."""
    given = bearer(authorization)
    expected = settings.api_token
    if expected is not None and secrets.compare_digest(given.encode(), expected.encode()):
        return BOOTSTRAP
    if given.startswith(TOKEN_PREFIX):
        return IDENTITIES.cached(given) or Lookup(given)
    return BOOTSTRAP if expected is None else None
