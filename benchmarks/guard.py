"""What the request guard adds to each request (the token check, the browser checks).

    python -m benchmarks.guard [--requests 20000]

Calls an ASGI app that answers at once, bare and wrapped in ``RequestGuard``, in one
process, alternating rounds: a submit's POST with a token, a 500-byte JSON body and
browser headers. Prints the microseconds the guard adds per request; a submit through
the whole stack takes ~1 ms (``benchmarks.api``), so this is its share.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine

from benchmarks.common import print_table, save
from service.api.guard import RequestGuard
from service.settings import Settings

TOKEN = "benchmark-token-0123456789"
BODY = b'{"recipe": "mlp-regression", "name": "' + b"x" * 440 + b'", "epochs": 1}'
SCOPE = {
    "type": "http",
    "method": "POST",
    "path": "/api/v1/jobs",
    "headers": [
        (b"host", b"127.0.0.1:8000"),
        (b"authorization", f"Bearer {TOKEN}".encode()),
        (b"content-type", b"application/json"),
        (b"content-length", str(len(BODY)).encode()),
        (b"origin", b"http://127.0.0.1:8000"),
        (b"sec-fetch-site", b"same-origin"),
    ],
}


async def answer(scope: Any, receive: Any, send: Any) -> None:
    """Read the body, answer 201: the app's side of a submit without its work."""
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 201, "headers": []})
    await send({"type": "http.response.body", "body": b"{}"})


async def per_request_us(app: Any, requests: int) -> float:
    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": BODY, "more_body": False}

    async def send(message: Any) -> None:
        pass

    start = time.perf_counter()
    for _ in range(requests):
        await app(dict(SCOPE), receive, send)
    return (time.perf_counter() - start) / requests * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    settings = Settings(api_token=TOKEN, data_dir=Path("/nonexistent"))
    guarded = RequestGuard(
        answer,
        settings=settings,
        engine=create_engine("sqlite://"),  # the bootstrap token is never looked up
        guarded=lambda path: path.startswith("/api/v1"),
        streamed=lambda method, path: False,
    )
    bare, wrapped = [], []
    for _ in range(args.rounds):
        bare.append(asyncio.run(per_request_us(answer, args.requests)))
        wrapped.append(asyncio.run(per_request_us(guarded, args.requests)))
    rows = [
        {
            "bare us": statistics.median(bare),
            "guarded us": statistics.median(wrapped),
            "guard adds us": statistics.median(w - b for w, b in zip(wrapped, bare, strict=True)),
        }
    ]
    print_table(f"per request, median of {args.rounds} rounds of {args.requests}", rows)
    print(f"\nsaved to {save('guard', rows)}")


if __name__ == "__main__":
    main()
