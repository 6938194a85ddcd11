"""A webhook receiver in the standard library: it checks each delivery's signature with
``trainyard.signatures.verify``, answers 401 to one that fails and 204 to one that passes,
and prints each event once (a retried delivery carries the same signed "delivery" id).

    TRAINYARD_WEBHOOK_SECRET=... python examples/client/webhook_receiver.py --port 8080

``--port 0`` takes a free port; the first line printed says which.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections import OrderedDict
from http.server import BaseHTTPRequestHandler, HTTPServer

from trainyard.signatures import (
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    BadSignature,
    verify,
)

SECRET_ENV = "TRAINYARD_WEBHOOK_SECRET"
REMEMBERED = 10_000  # delivery ids kept for deduplication, the oldest forgotten first
MAX_BODY_BYTES = 1 << 20


class Receiver(HTTPServer):
    def __init__(self, address: tuple[str, int], secret: str) -> None:
        super().__init__(address, Handler)
        self.secret = secret
        self.seen: OrderedDict[str, None] = OrderedDict()

    def first_time(self, delivery: str) -> bool:
        """Whether this delivery id is new (and remember it)."""
        if delivery in self.seen:
            return False
        self.seen[delivery] = None
        if len(self.seen) > REMEMBERED:
            self.seen.popitem(last=False)
        return True


class Handler(BaseHTTPRequestHandler):
    server: Receiver

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY_BYTES:
            self.answer(413)
            return
        body = self.rfile.read(length)
        try:
            # the raw bytes as received: parsing and re-encoding would change what was signed
            verify(
                self.server.secret,
                body,
                self.headers.get(TIMESTAMP_HEADER),
                self.headers.get(SIGNATURE_HEADER),
            )
        except BadSignature as exc:
            print(f"refused a delivery: {exc}", flush=True)
            self.answer(401)
            return
        # what to act on comes from the signed body, not the headers (which are not signed)
        try:
            payload = json.loads(body)
        except ValueError:
            payload = {"text": body.decode(errors="replace")}
        delivery = str(payload.get("delivery", ""))  # a Slack-format body has none
        event = payload.get("event", "?")
        if delivery and not self.server.first_time(delivery):
            print(f"delivery {delivery} again ({event}): already handled", flush=True)
        else:
            shown = json.dumps(payload, separators=(",", ":"))
            print(f"event {event} (delivery {delivery}): {shown}", flush=True)
        # 204 for a repeat too: the sender stops retrying once any attempt is answered 2xx
        self.answer(204)

    def answer(self, status: int) -> None:
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass  # each delivery is printed above, once


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    args = parser.parse_args()
    secret = os.environ.get(SECRET_ENV)
    if not secret:
        sys.exit(f"set {SECRET_ENV} to the webhook's secret")
    with Receiver((args.host, args.port), secret) as server:
        print(f"listening on http://{args.host}:{server.server_port}/", flush=True)
        with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C: stop quietly
            server.serve_forever()


if __name__ == "__main__":
    main()
