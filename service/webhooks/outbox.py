"""The outbox: a job's or sweep's end becomes deliveries in the transaction that ends it.

``enqueue`` is one INSERT … SELECT from the active webhooks that match (the subject's
owner's, or an admin's ``all_users`` ones; the event among their events), run in the
caller's transaction: a change that rolls back leaves no delivery, one that commits
leaves one per matching webhook, which the dispatcher sends however the process that
made the change ends. With no webhook matching it is one indexed read that inserts
nothing.

The payload (the JSON body; a Slack text is made from it when sent)::

    {"event": "job.succeeded", "created_at": "2026-12-02T15:04:05.123456+00:00",
     "job": {"id": 12, "name": "...", "owner": "alice", "status": "succeeded",
             "reason_code": "succeeded", "reason_message": "...", "recipe": "tiny",
             "sweep_id": null, "attempt": 1, "created_at": "...", "started_at": "...",
             "finished_at": "...", "url_path": "/api/v1/jobs/12"}}

or ``"sweep": {"id", "name", "owner", "status", "reason_code", "reason_message",
"created_at", "finished_at", "url_path"}``. The delivery's id is a header
(X-Trainyard-Delivery), not part of the body.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, cast, exists, func, insert, literal, or_, select
from sqlalchemy.dialects.postgresql import JSONB
from sqlmodel import Session

from service.models import Job, JobStatus, utcnow
from service.sweeps.models import Sweep, SweepStatus
from service.webhooks.models import DeliveryState, Webhook, WebhookDelivery, WebhookEvent

webhook_table = Webhook.__table__  # type: ignore[attr-defined]
delivery_table = WebhookDelivery.__table__  # type: ignore[attr-defined]

JOB_EVENTS = {
    JobStatus.succeeded: WebhookEvent.job_succeeded,
    JobStatus.failed: WebhookEvent.job_failed,
    JobStatus.cancelled: WebhookEvent.job_cancelled,
    JobStatus.queued: WebhookEvent.job_requeued,  # only ever from running (ALLOWED_FROM)
}
SWEEP_EVENTS = {
    SweepStatus.finished: WebhookEvent.sweep_finished,
    SweepStatus.failed: WebhookEvent.sweep_failed,
    SweepStatus.cancelled: WebhookEvent.sweep_cancelled,
}


def _when(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def job_changed(session: Session, job: Job, status: JobStatus) -> None:
    """A job moved to ``status``: tell the webhooks that want to know (its end, or a
    requeue); nothing for any other move."""
    event = JOB_EVENTS.get(status)
    if event is None:
        return
    assert job.id is not None
    body = {
        "id": job.id,
        "name": job.name,
        "owner": job.owner,
        "status": str(job.status),
        "reason_code": job.reason_code,
        "reason_message": job.reason_message,
        "recipe": job.recipe,
        "sweep_id": job.sweep_id,
        "attempt": job.attempt,
        "created_at": _when(job.created_at),
        "started_at": _when(job.started_at),
        "finished_at": _when(job.finished_at),
        "url_path": f"/api/v1/jobs/{job.id}",
    }
    enqueue(session, event, f"job {job.id}", job.owner, {"job": body})


def sweep_ended(session: Session, sweep: Sweep) -> None:
    """A sweep ended (finished, failed or cancelled): tell the webhooks that want to know."""
    event = SWEEP_EVENTS.get(sweep.status)
    if event is None:
        return
    assert sweep.id is not None
    body = {
        "id": sweep.id,
        "name": sweep.name,
        "owner": sweep.owner,
        "status": str(sweep.status),
        "reason_code": sweep.reason_code,
        "reason_message": sweep.reason_message,
        "created_at": _when(sweep.created_at),
        "finished_at": _when(sweep.finished_at),
        "url_path": f"/api/v1/sweeps/{sweep.id}",
    }
    enqueue(session, event, f"sweep {sweep.id}", sweep.owner, {"sweep": body})


def _wants(session: Session, event: str) -> Any:
    """The webhook's events include ``event`` (a JSON list: each database's own test)."""
    if session.get_bind().dialect.name == "postgresql":
        return cast(webhook_table.c.events, JSONB).contains(cast(literal([event], JSON), JSONB))
    each = func.json_each(webhook_table.c.events).table_valued("value")
    return exists(select(literal(1)).select_from(each).where(each.c.value == event))


def enqueue(
    session: Session, event: WebhookEvent, subject: str, owner: str, detail: dict[str, Any]
) -> None:
    """One delivery of ``event`` per active webhook of ``owner`` (or of every user) that
    wants it, in the caller's transaction: one INSERT … SELECT."""
    now = utcnow()
    payload = {"event": event.value, "created_at": now.isoformat(), **detail}
    w = webhook_table
    matching = (
        select(
            w.c.id,
            literal(event.value),
            literal(subject),
            literal(payload, JSON),
            literal(DeliveryState.pending.value),
            literal(0),
            literal(now, delivery_table.c.next_attempt_at.type),
            literal(now, delivery_table.c.created_at.type),
        )
        .where(w.c.active, or_(w.c.owner == owner, w.c.all_users), _wants(session, event.value))
        # PostgreSQL: a webhook deleted meanwhile is skipped, not a foreign-key error
        # that would fail the job's own change (SQLite has one writer: no such race).
        .with_for_update(read=True, key_share=True)
    )
    columns = [
        "webhook_id", "event", "subject", "payload", "state", "attempts", "next_attempt_at",
        "created_at",
    ]  # fmt: skip
    session.execute(insert(delivery_table).from_select(columns, matching))


def enqueue_ping(session: Session, webhook: Webhook, by: str) -> WebhookDelivery:
    """A ``webhook.ping`` delivery to one webhook (its owner's or an admin's request)."""
    assert webhook.id is not None
    now = utcnow()
    payload = {
        "event": WebhookEvent.ping.value,
        "created_at": now.isoformat(),
        "webhook": {"id": webhook.id, "owner": webhook.owner, "events": webhook.events},
        "by": by,
    }
    delivery = WebhookDelivery(
        webhook_id=webhook.id,
        event=WebhookEvent.ping.value,
        subject=f"webhook {webhook.id}",
        payload=payload,
        next_attempt_at=now,
        created_at=now,
    )
    session.add(delivery)
    session.flush()
    return delivery
