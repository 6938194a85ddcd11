"""The audit trail: who submitted, cancelled, reran or preempted a job, who added a user
or created or revoked a token, and who deleted a blob, and when. Each event is written in
the transaction of the change it records, so neither is ever kept without the other."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from sqlalchemy import Engine, func, insert
from sqlmodel import Session, SQLModel, col, select

from service.db import write_session
from service.models import AuditEvent


class Action(StrEnum):
    submitted = "submitted"
    cancelled = "cancelled"
    pruned = "pruned"  # a sweep's driver stopped a trial that fell behind
    sweep_submitted = "sweep_submitted"
    sweep_cancelled = "sweep_cancelled"
    reran = "reran"
    preempted = "preempted"
    user_added = "user_added"
    user_changed = "user_changed"
    token_created = "token_created"
    token_revoked = "token_revoked"
    blob_deleted = "blob_deleted"  # detail: whether its bytes went, and whose upload
    webhook_added = "webhook_added"  # detail: where (scheme://host:port only), events
    webhook_deleted = "webhook_deleted"


def record(session: Session, actor: str, action: Action, target: str, **detail: Any) -> None:
    """Add an event to the caller's transaction."""
    session.add(AuditEvent(actor=actor, action=action, target=target, detail=detail or None))


def record_many(session: Session, events: list[dict[str, Any]]) -> None:
    """Add events (``actor``, ``action``, ``target``, ``detail``) in one INSERT: a batch of
    submits records its jobs this way."""
    if events:
        session.execute(insert(AuditEvent), events)


class AuditPage(SQLModel):
    items: list[AuditEvent]
    total: int
    limit: int
    offset: int


def page(session: Session, *, limit: int, offset: int, actor: str | None = None) -> AuditPage:
    """Events, newest first (optionally one actor's)."""
    query = select(AuditEvent)
    count = select(func.count()).select_from(AuditEvent)
    if actor is not None:
        query = query.where(col(AuditEvent.actor) == actor)
        count = count.where(col(AuditEvent.actor) == actor)
    total = session.exec(count).one()
    items = session.exec(query.order_by(col(AuditEvent.id).desc()).limit(limit).offset(offset))
    return AuditPage(items=list(items), total=int(total), limit=limit, offset=offset)


def record_now(engine: Engine, actor: str, action: Action, target: str, **detail: Any) -> None:
    """An event in a transaction of its own (a rerun's: its new job's submit is recorded
    with the job)."""
    with write_session(engine) as session:
        record(session, actor, action, target, **detail)
