"""What a delivery sends: its body (the payload as JSON, or Slack's one-line text) and
its headers, signed with the webhook's secret (``trainyard.signatures``)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from service.webhooks.deliveries import Claimed
from service.webhooks.models import WebhookFormat
from trainyard.signatures import (
    DELIVERY_HEADER,
    EVENT_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    sign,
)

USER_AGENT = "Trainyard-Webhooks"
REASON_SHOWN = 200  # characters of a failure's reason in a Slack line


def body(claimed: Claimed) -> bytes:
    """The bytes POSTed: the payload with its delivery's id (under the signature, so a
    captured delivery cannot be passed off as another by changing a header), or for
    Slack ``{"text": <one line>}``."""
    if claimed.format == WebhookFormat.slack:
        return json.dumps({"text": slack_text(claimed.payload)}).encode()
    return json.dumps({"delivery": claimed.id, **claimed.payload}, separators=(",", ":")).encode()


def headers(claimed: Claimed, content: bytes, timestamp: int) -> dict[str, str]:
    """The delivery's headers; the signature covers ``timestamp`` and ``content``."""
    return {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        EVENT_HEADER: claimed.event,
        DELIVERY_HEADER: str(claimed.id),
        TIMESTAMP_HEADER: str(timestamp),
        SIGNATURE_HEADER: sign(claimed.secret, timestamp, content),
    }


def slack_text(payload: dict[str, Any]) -> str:
    """One line for people: "Job 12 (name) succeeded after 3m 2s — owner alice"."""
    if "job" in payload:
        job = payload["job"]
        what = _named("Job", job)
        took = _took(job.get("started_at"), job.get("finished_at"))
        if payload["event"] == "job.requeued":
            line = f"{what} requeued for attempt {job['attempt']}{_why(job)}"
        elif job.get("reason_code") == "pruned":
            line = f"{what} pruned by its sweep{took}"
        else:
            failed = job["status"] == "failed"
            line = f"{what} {job['status']}{took}{_why(job) if failed else ''}"
        return _escaped(f"{line} — owner {job['owner']}")
    if "sweep" in payload:
        sweep = payload["sweep"]
        line = f"{_named('Sweep', sweep)} {sweep['status']}{_why(sweep)}"
        return _escaped(f"{line} — owner {sweep['owner']}")
    hook = payload.get("webhook", {})
    return _escaped(f"Trainyard webhook {hook.get('id')} works (a ping from {payload.get('by')})")


def _named(kind: str, thing: dict[str, Any]) -> str:
    name = thing.get("name")
    return f"{kind} {thing['id']}" + (f" ({name})" if name else "")


def _why(thing: dict[str, Any]) -> str:
    message = (thing.get("reason_message") or "").splitlines()
    if not message:
        return ""
    first = message[0]
    return ": " + (first if len(first) <= REASON_SHOWN else first[: REASON_SHOWN - 1] + "…")


def _took(started: str | None, finished: str | None) -> str:
    """ " after 3m 2s", from the ISO times; "" if the job never started."""
    if not started or not finished:
        return ""
    took = datetime.fromisoformat(finished) - datetime.fromisoformat(started)
    seconds = int(took.total_seconds())
    return f" after {duration(max(seconds, 0))}"


def duration(seconds: int) -> str:
    """3m 2s, 1h 4m, 2d 3h, 45s: the two largest units."""
    units = (("d", 86400), ("h", 3600), ("m", 60), ("s", 1))
    parts: list[str] = []
    for unit, size in units:
        count, seconds = divmod(seconds, size)
        if count or parts:
            parts.append(f"{count}{unit}")
    return " ".join(parts[:2]) or "0s"


def _escaped(text: str) -> str:
    """Slack reads <…> as links and mentions (<!channel>) and & as an entity: a job's name
    must not ping a channel."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
