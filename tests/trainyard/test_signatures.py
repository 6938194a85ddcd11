"""A webhook delivery's signature, as a receiver checks it."""

from __future__ import annotations

import time

import pytest

from trainyard.signatures import BadSignature, sign, verify

SECRET = "a-secret-of-24-characters"
BODY = b'{"delivery":7,"event":"job.succeeded"}'


def test_a_delivery_signed_with_the_secret_is_taken() -> None:
    now = int(time.time())
    verify(SECRET, BODY, str(now), sign(SECRET, now, BODY))


@pytest.mark.parametrize(
    ("body", "timestamp", "signature", "why"),
    [
        (BODY.replace(b"7", b"8"), 0, None, "does not match"),  # another delivery id
        (BODY, -600, None, "too old"),  # a replay, ten minutes on
        (BODY, 600, None, "from the future"),
        (BODY, 0, "sha256=caf\u00e9", "does not match"),  # not ASCII: refused, not a crash
        (BODY, 0, "", "missing"),
    ],
)
def test_anything_else_is_refused(
    body: bytes, timestamp: int, signature: str | None, why: str
) -> None:
    sent = int(time.time()) + timestamp
    given = sign(SECRET, sent, BODY) if signature is None else signature
    with pytest.raises(BadSignature, match=why):
        verify(SECRET, body, str(sent), given)
    with pytest.raises(BadSignature, match="not a number"):
        verify(SECRET, BODY, "soon", sign(SECRET, sent, BODY))
