"""Webhooks' rows as the API reads and writes them: create, list, one with its last
deliveries, delete, ping. Another user's webhook is "not found" to a user who is not an
admin, so its id tells them nothing. (The dispatcher's statements are in
``deliveries``; the outbox's in ``outbox``.)"""

from __future__ import annotations

import secrets

from sqlalchemy import Engine, delete, func
from sqlmodel import Session, col, select

from service import audit
from service.audit import Action
from service.db import write_session
from service.errors import WebhookNotFound
from service.settings import Settings
from service.users import Identity, check_admin
from service.webhooks import address, outbox
from service.webhooks.models import (
    DeliveryRead,
    Webhook,
    WebhookCreate,
    WebhookCreated,
    WebhookDelivery,
    WebhookFormat,
    WebhookList,
    WebhookRead,
)

DELIVERIES_SHOWN = 20


def create_webhook(
    engine: Engine, who: Identity, spec: WebhookCreate, settings: Settings
) -> WebhookCreated:
    """Store a webhook of ``who``'s; its secret (given, or made here) is in this answer
    only. Blocks on DNS (the address check): call it off the event loop."""
    if spec.all_users:
        check_admin(who, "create a webhook told of every user's jobs (all_users)")
    address.check_url(spec.url, settings.webhook_allow_private_addresses)
    secret = spec.secret or secrets.token_urlsafe(32)
    with write_session(engine) as session:
        row = Webhook(
            owner=who.name,
            url=spec.url,
            events=[e.value for e in spec.events],
            secret=secret,
            format=spec.format,
            all_users=spec.all_users,
        )
        session.add(row)
        session.flush()
        # where, as logs show it: a URL's path may be its own secret (a Slack webhook's)
        audit.record(
            session, who.name, Action.webhook_added, f"webhook {row.id}",
            url=address.shown(spec.url), events=row.events, all_users=spec.all_users,
        )  # fmt: skip
        # the create's answer shows the URL whole, as given; reads do not (see _read)
        return WebhookCreated(**{**_read(row).model_dump(), "url": spec.url}, secret=secret)


def list_webhooks(
    session: Session, who: Identity, *, owner: str | None, limit: int, offset: int
) -> WebhookList:
    """Webhooks, newest first: the asker's own; an admin's, everyone's (or ``owner``'s)."""
    if not who.admin:
        owner = who.name
    query = select(Webhook)
    count = select(func.count()).select_from(Webhook)
    if owner is not None:
        query = query.where(col(Webhook.owner) == owner)
        count = count.where(col(Webhook.owner) == owner)
    total = session.exec(count).one()
    rows = session.exec(query.order_by(col(Webhook.id).desc()).limit(limit).offset(offset))
    return WebhookList(items=[_read(w) for w in rows], total=total, limit=limit, offset=offset)


def get_webhook(session: Session, who: Identity, webhook_id: int) -> WebhookRead:
    """One webhook with its last deliveries, newest first."""
    webhook = _visible(session, who, webhook_id)
    deliveries = session.exec(
        select(WebhookDelivery)
        .where(col(WebhookDelivery.webhook_id) == webhook_id)
        .order_by(col(WebhookDelivery.id).desc())
        .limit(DELIVERIES_SHOWN)
    ).all()
    read = _read(webhook)
    read.deliveries = [DeliveryRead.model_validate(d, from_attributes=True) for d in deliveries]
    return read


def delete_webhook(engine: Engine, who: Identity, webhook_id: int) -> None:
    """Delete a webhook and its deliveries (those being sent are sent, not recorded)."""
    with write_session(engine) as session:
        webhook = _visible(session, who, webhook_id)
        session.exec(delete(Webhook).where(col(Webhook.id) == webhook_id))
        audit.record(
            session, who.name, Action.webhook_deleted, f"webhook {webhook_id}",
            owner=webhook.owner,
        )  # fmt: skip


def ping(engine: Engine, who: Identity, webhook_id: int) -> DeliveryRead:
    """Enqueue a ``webhook.ping`` delivery to the webhook."""
    with write_session(engine) as session:
        webhook = _visible(session, who, webhook_id)
        delivery = outbox.enqueue_ping(session, webhook, who.name)
        return DeliveryRead.model_validate(delivery, from_attributes=True)


def _visible(session: Session, who: Identity, webhook_id: int) -> Webhook:
    """The webhook, if the asker may see it: its owner, or an admin."""
    webhook = session.get(Webhook, webhook_id)
    if webhook is None or not (who.admin or webhook.owner == who.name):
        raise WebhookNotFound(webhook_id)
    return webhook


def _read(webhook: Webhook) -> WebhookRead:
    """A webhook as reads show it: its URL without a password or query, and a Slack
    webhook's without its last part (Slack's secret): credentials, shown once, at create."""
    read = WebhookRead.model_validate(webhook, from_attributes=True)
    read.url = address.masked(webhook.url, secret_path=webhook.format == WebhookFormat.slack)
    return read
