"""Webhook signatures: how the server signs a delivery and how a receiver checks one.

A delivery carries ``X-Trainyard-Timestamp`` (Unix seconds) and ``X-Trainyard-Signature:
sha256=<hex>``, the HMAC-SHA256, keyed with the webhook's secret, of the timestamp, a dot
and the body. Signing the timestamp with the body lets a receiver refuse a replayed
delivery: a captured request cannot be sent again later with a new timestamp.
"""

from __future__ import annotations

import hashlib
import hmac
import time

TIMESTAMP_HEADER = "X-Trainyard-Timestamp"
SIGNATURE_HEADER = "X-Trainyard-Signature"
EVENT_HEADER = "X-Trainyard-Event"
DELIVERY_HEADER = "X-Trainyard-Delivery"  # the same on every retry (the body's "delivery")
TOLERANCE_S = 300  # how old a delivery a receiver takes, by default


class BadSignature(Exception):
    """The delivery was not signed with this secret, or is too old to take."""


def sign(secret: str, timestamp: int, body: bytes) -> str:
    """The ``X-Trainyard-Signature`` value of ``body`` sent at ``timestamp``."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"sha256={mac.hexdigest()}"


def verify(
    secret: str,
    body: bytes,
    timestamp: str | None,
    signature: str | None,
    *,
    tolerance_s: float = TOLERANCE_S,
    now: float | None = None,
) -> None:
    """Check a delivery's headers against its raw body; raise ``BadSignature`` if it was
    not signed with ``secret`` or its timestamp is over ``tolerance_s`` from now."""
    if not timestamp or not signature:
        raise BadSignature(f"missing {TIMESTAMP_HEADER} or {SIGNATURE_HEADER}")
    try:
        sent = int(timestamp)
    except ValueError as exc:
        raise BadSignature(f"{TIMESTAMP_HEADER} is not a number of seconds") from exc
    if abs((time.time() if now is None else now) - sent) > tolerance_s:
        raise BadSignature("the delivery is too old (or from the future): a replay?")
    # as bytes: compare_digest refuses str that is not ASCII (a forged header may be)
    given = signature.encode("utf-8", "surrogateescape")
    if not hmac.compare_digest(sign(secret, sent, body).encode(), given):
        raise BadSignature("the signature does not match the body and the secret")
