"""The dispatcher's statements: claim due deliveries, record an attempt, hand claims back,
prune old deliveries.

A claim is a lease (``claimed_until``): a delivery claimed by one server process is not
due to any other until its lease has run out, which lasts longer than an attempt may
(the attempt's timeout and a margin), so several processes never send one delivery at
once, and one whose process died is sent by another later. An attempt is recorded only
where the claim still holds (the same ``claimed_until``), so a claim that lapsed and was
taken by another process records nothing of the first one's. A receiver may still get
one delivery twice (it answered, then the server died before recording it): receivers
dedupe on X-Trainyard-Delivery.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Engine, delete, func, literal_column, or_, select, update

from service.db import read_session, write_session
from service.models import utcnow
from service.webhooks.models import (
    ERROR_MAX,
    DeliveryState,
    Webhook,
    WebhookDelivery,
    WebhookFormat,
)

delivery = WebhookDelivery.__table__  # type: ignore[attr-defined]
webhook = Webhook.__table__  # type: ignore[attr-defined]

RETRY_MAX_S = 3600.0  # the back-off's cap: a receiver down for a day is tried hourly
KEEP_PER_WEBHOOK = 100  # delivered and failed deliveries kept per webhook; older are pruned
# ``state = 'pending'`` as a literal: the text the due-read's partial index matches.
PENDING = delivery.c.state == literal_column(f"'{DeliveryState.pending.value}'")


@dataclass(frozen=True)
class Claimed:
    """A delivery this process holds until ``claimed_until``, with what sending it needs."""

    id: int
    event: str
    payload: dict[str, Any]
    attempts: int  # made before this one
    claimed_until: datetime  # the claim's fence
    webhook_id: int
    url: str = field(repr=False)  # its path may be a secret (a Slack webhook's)
    secret: str = field(repr=False)  # never in a log line that prints a claim
    format: WebhookFormat


@dataclass(frozen=True)
class Attempt:
    """How one attempt went."""

    delivered: bool  # the receiver answered 2xx
    status_code: int | None = None  # its answer's status, if it answered
    error: str | None = None  # why it failed
    final: bool = False  # not worth another attempt (the address is refused)


def _due(now: datetime) -> list[Any]:
    return [
        PENDING,
        delivery.c.next_attempt_at <= now,
        or_(delivery.c.claimed_until.is_(None), delivery.c.claimed_until < now),
    ]


def claim_due(engine: Engine, limit: int, lease_s: float) -> list[Claimed]:
    """Claim up to ``limit`` due deliveries, the longest due first, for ``lease_s``."""
    now = utcnow()
    with read_session(engine) as session:  # most polls find none: no write lock for that
        if session.execute(select(delivery.c.id).where(*_due(now)).limit(1)).first() is None:
            return []
    until = now + timedelta(seconds=lease_s)
    with write_session(engine) as session:
        # SKIP LOCKED (PostgreSQL): what another process is claiming now is its own.
        due = (
            select(delivery.c.id)
            .where(*_due(now))
            .order_by(delivery.c.next_attempt_at)
            .limit(limit)
            .with_for_update(skip_locked=True)
        )
        ids = list(
            session.execute(
                update(delivery)
                .where(delivery.c.id.in_(due), *_due(now))
                .values(claimed_until=until)
                .returning(delivery.c.id)
            ).scalars()
        )
        if not ids:
            return []
        rows = session.execute(
            select(
                delivery.c.id,
                delivery.c.event,
                delivery.c.payload,
                delivery.c.attempts,
                webhook.c.id.label("webhook_id"),
                webhook.c.url,
                webhook.c.secret,
                webhook.c.format,
            )  # fmt: skip
            .join(webhook, webhook.c.id == delivery.c.webhook_id)
            .where(delivery.c.id.in_(ids))
            .order_by(delivery.c.next_attempt_at)
        ).all()
    return [Claimed(claimed_until=until, **row._mapping) for row in rows]


def retry_delay_s(attempts: int, base_s: float) -> float:
    """Seconds before the next attempt, after ``attempts`` failed: base, 2 base, 4 base …
    capped at an hour."""
    return float(min(base_s * 2 ** (attempts - 1), RETRY_MAX_S))


def record(
    engine: Engine, claimed: Claimed, attempt: Attempt, *, retry_base_s: float, max_attempts: int
) -> DeliveryState | None:
    """Record an attempt: delivered, due again after the back-off, or failed for good
    (its last attempt, or ``final``). None if the claim no longer holds."""
    now = utcnow()
    attempts = claimed.attempts + 1
    values: dict[str, Any] = {"attempts": attempts, "claimed_until": None}
    if attempt.status_code is not None:
        values["last_status_code"] = attempt.status_code
    if attempt.delivered:
        state = DeliveryState.delivered
        values["delivered_at"] = now
    else:
        values["last_error"] = f"attempt {attempts}: {attempt.error}"[:ERROR_MAX]
        if attempt.final or attempts >= max_attempts:
            state = DeliveryState.failed
        else:
            state = DeliveryState.pending
            delay = retry_delay_s(attempts, retry_base_s)
            values["next_attempt_at"] = now + timedelta(seconds=delay)
    with write_session(engine) as session:
        done = session.execute(
            update(delivery)
            .where(*_held(claimed))
            .values(state=state, **values)
            .execution_options(synchronize_session=False)
        )
        return state if done.rowcount == 1 else None  # type: ignore[attr-defined]


def release(engine: Engine, claims: Sequence[Claimed]) -> None:
    """Hand claims back unsent (the server stopping mid-attempt): due again at once, to
    whichever process looks next."""
    if not claims:
        return
    with write_session(engine) as session:
        for claimed in claims:
            session.execute(update(delivery).where(*_held(claimed)).values(claimed_until=None))


def prune(engine: Engine, keep: int = KEEP_PER_WEBHOOK) -> int:
    """Delete delivered and failed deliveries past each webhook's newest ``keep``; how
    many went."""
    ended = delivery.c.state.in_([DeliveryState.delivered.value, DeliveryState.failed.value])
    ranked = (
        select(
            delivery.c.id,
            func.row_number()
            .over(partition_by=delivery.c.webhook_id, order_by=delivery.c.id.desc())
            .label("newer"),
        )
        .where(ended)
        .subquery()
    )
    old = select(ranked.c.id).where(ranked.c.newer > keep)
    with write_session(engine) as session:
        gone = session.execute(delete(delivery).where(delivery.c.id.in_(old)))
        return int(gone.rowcount)  # type: ignore[attr-defined]


def _held(claimed: Claimed) -> list[Any]:
    """The delivery is still pending and claimed by this claim."""
    return [
        delivery.c.id == claimed.id,
        PENDING,
        delivery.c.claimed_until == claimed.claimed_until,
    ]
