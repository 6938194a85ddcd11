"""Webhooks' tables and the API schemas built on them: ``WebhookCreate`` (what is posted),
``Webhook`` and ``WebhookDelivery`` (the rows), ``WebhookRead``, ``WebhookCreated``,
``DeliveryRead`` and ``WebhookList`` (what is shown).

A webhook is a user's URL that is told when their jobs and sweeps end. Each word sent is
a delivery row, written in the transaction of the change it tells of (``outbox``) and
sent by the server's dispatcher (``dispatcher``) until the receiver answers 2xx.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any
from urllib.parse import urlsplit

from pydantic import ConfigDict, StrictBool, field_validator
from sqlalchemy import JSON, Index, text
from sqlmodel import Field, SQLModel

from service.models import USER_NAME_MAX, EnumAsString, NulFreeStr, UTCDateTime, utcnow

URL_MAX = 2000
SECRET_MIN = 16
SECRET_MAX = 200
EVENT_MAX = 32
SUBJECT_MAX = 64
ERROR_MAX = 1000


class WebhookEvent(StrEnum):
    job_succeeded = "job.succeeded"  # a job trained to its end
    job_failed = "job.failed"  # a job ended failed (no attempt left, or none worth making)
    job_cancelled = "job.cancelled"  # a job stopped on request (or pruned by its sweep)
    job_requeued = "job.requeued"  # a running job went back to the queue (a retry, a hand-back)
    sweep_finished = "sweep.finished"  # every trial of a sweep ended
    sweep_failed = "sweep.failed"  # a sweep stopped: its first trials all failed
    sweep_cancelled = "sweep.cancelled"  # a sweep cancelled on request
    ping = "webhook.ping"  # POST /webhooks/{id}/ping: sent whatever the webhook's events


# What a webhook is told of when its events are not given: every end, not the requeues.
DEFAULT_EVENTS = [
    WebhookEvent.job_succeeded,
    WebhookEvent.job_failed,
    WebhookEvent.job_cancelled,
    WebhookEvent.sweep_finished,
    WebhookEvent.sweep_failed,
    WebhookEvent.sweep_cancelled,
]


class WebhookFormat(StrEnum):
    json = "json"  # the event as JSON (see docs/architecture.md, "Webhooks")
    slack = "slack"  # {"text": a one-line sentence}: what a Slack incoming webhook takes


class DeliveryState(StrEnum):
    pending = "pending"  # to be sent (again) at next_attempt_at
    delivered = "delivered"  # the receiver answered 2xx
    failed = "failed"  # given up: every attempt failed, or the address was refused


# The dispatcher's due-read is served by a partial index that holds pending deliveries
# only; a query uses it only if its text says ``state = 'pending'`` (``deliveries.PENDING``).
PENDING_ONLY: dict[str, Any] = {
    f"{dialect}_where": text("state = 'pending'") for dialect in ("sqlite", "postgresql")
}


class Webhook(SQLModel, table=True):
    """A user's receiver: where to send which events, signed with which secret."""

    __tablename__ = "webhook"
    __table_args__ = (
        # The outbox's match (owner = the job's owner, or all_users), and a user's listing.
        Index("ix_webhook_owner", "owner", "id"),
        Index("ix_webhook_all_users", "all_users"),
    )

    id: int | None = Field(default=None, primary_key=True)
    owner: str = Field(foreign_key="trainyard_user.name", max_length=USER_NAME_MAX)
    url: str = Field(max_length=URL_MAX)
    events: list[str] = Field(sa_type=JSON)  # WebhookEvent values
    # Kept as given: the dispatcher signs with it (a hash could not sign).
    secret: str = Field(max_length=SECRET_MAX)
    format: WebhookFormat = Field(default=WebhookFormat.json, sa_type=EnumAsString(WebhookFormat))
    all_users: bool = False  # an admin's: every user's jobs and sweeps
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    active: bool = True  # inactive: no new delivery is enqueued for it


class WebhookDelivery(SQLModel, table=True):
    """One event to send to one webhook, and how its attempts went."""

    __tablename__ = "webhook_delivery"
    __table_args__ = (
        # The dispatcher's due-read: pending deliveries by when they are due.
        Index("ix_webhook_delivery_due", "next_attempt_at", **PENDING_ONLY),
        # A webhook's last deliveries (its page), and the prune's newest 100 of each.
        Index("ix_webhook_delivery_webhook", "webhook_id", "id"),
    )

    id: int | None = Field(default=None, primary_key=True)
    webhook_id: int = Field(foreign_key="webhook.id", ondelete="CASCADE")
    event: str = Field(max_length=EVENT_MAX)
    subject: str = Field(max_length=SUBJECT_MAX)  # "job 12", "sweep 3"
    payload: dict[str, Any] = Field(sa_type=JSON)  # the JSON body; slack's text is made from it
    state: DeliveryState = Field(default=DeliveryState.pending, sa_type=EnumAsString(DeliveryState))
    attempts: int = 0
    next_attempt_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    # A dispatcher's claim: no other takes the delivery before this (a lease, so that
    # several server processes never send it at once; one that died lets it lapse).
    claimed_until: datetime | None = Field(default=None, sa_type=UTCDateTime)
    last_status_code: int | None = None
    last_error: str | None = Field(default=None, max_length=ERROR_MAX)
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    delivered_at: datetime | None = Field(default=None, sa_type=UTCDateTime)


WEBHOOK_EXAMPLE: dict[str, Any] = {
    "url": "https://ci.example.com/trainyard",
    "events": ["job.succeeded", "job.failed"],
    "format": "json",
}


class WebhookCreate(SQLModel):
    """A webhook as posted; unknown fields are refused."""

    model_config = ConfigDict(  # type: ignore[assignment]
        extra="forbid", json_schema_extra={"examples": [WEBHOOK_EXAMPLE]}
    )

    url: NulFreeStr = Field(
        max_length=URL_MAX,
        description="Where each event is POSTed: http or https, a public address (a "
        "private, loopback or link-local one is refused unless the server allows them). "
        "Redirects are not followed.",
        schema_extra={"examples": ["https://ci.example.com/trainyard"]},
    )
    events: list[WebhookEvent] = Field(
        default_factory=lambda: list(DEFAULT_EVENTS),
        min_length=1,
        max_length=len(WebhookEvent),
        description="What to be told of; default: every job's and sweep's end (not job.requeued).",
        schema_extra={"examples": [["job.succeeded", "job.failed"]]},
    )
    secret: NulFreeStr | None = Field(
        None,
        min_length=SECRET_MIN,
        max_length=SECRET_MAX,
        description="The key deliveries are signed with (X-Trainyard-Signature); default: "
        "one made for you, shown once in this answer.",
    )
    format: WebhookFormat = Field(
        WebhookFormat.json,
        description='json: the event as JSON; slack: {"text": "<one line>"} for a Slack '
        "incoming webhook.",
    )
    all_users: StrictBool = Field(
        False, description="Every user's jobs and sweeps, not only yours (admins only)."
    )

    @field_validator("url")
    @classmethod
    def _http_url(cls, url: str) -> str:
        try:
            parts = urlsplit(url)
            parts.port  # noqa: B018 (raises on a port that is not a number)
        except ValueError as exc:
            raise ValueError(f"not a URL: {exc}") from None
        if parts.scheme not in ("http", "https"):
            raise ValueError("the URL must start with http:// or https://")
        if not parts.hostname:
            raise ValueError("the URL names no host")
        return url

    @field_validator("events")
    @classmethod
    def _once_each(cls, events: list[WebhookEvent]) -> list[WebhookEvent]:
        if WebhookEvent.ping in events:
            raise ValueError("webhook.ping is sent on request (POST .../ping), not subscribed")
        return list(dict.fromkeys(events))


class DeliveryRead(SQLModel):
    """One event sent (or to be sent) to a webhook."""

    id: int = Field(description="Also its X-Trainyard-Delivery header: the same on each retry.")
    event: str = Field(schema_extra={"examples": ["job.succeeded"]})
    subject: str = Field(description="What it tells of.", schema_extra={"examples": ["job 12"]})
    state: DeliveryState
    attempts: int = Field(description="Attempts made so far.")
    last_status_code: int | None = Field(
        None, description="The receiver's HTTP status at the last attempt that got an answer."
    )
    last_error: str | None = Field(
        None, description="Why the last failed attempt failed (kept once delivered)."
    )
    created_at: datetime
    next_attempt_at: datetime = Field(description="When a pending delivery is sent next.")
    delivered_at: datetime | None = None


class WebhookRead(SQLModel):
    """A webhook as shown: never its secret."""

    id: int
    owner: str = Field(description="Whose it is; it is told of their jobs and sweeps.")
    url: str
    events: list[str]
    format: WebhookFormat
    all_users: bool = Field(description="Told of every user's jobs and sweeps.")
    active: bool
    created_at: datetime
    deliveries: list[DeliveryRead] = Field(
        default_factory=list,
        description="Its last 20 deliveries, newest first (GET one webhook; empty in a list).",
    )


class WebhookCreated(WebhookRead):
    secret: str = Field(
        description="The signing secret: shown in this answer only, never again.",
        schema_extra={"examples": ["0sWb5i6o7bF6Qk1d3X0n2y5E1t8cQ9pJmV4rT7uYh2A"]},
    )


class WebhookList(SQLModel):
    items: list[WebhookRead]
    total: int = Field(description="Webhooks matching, all pages.")
    limit: int
    offset: int
