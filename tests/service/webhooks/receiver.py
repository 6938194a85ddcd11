"""A real webhook receiver for the tests: an HTTP server on 127.0.0.1 in a thread that
keeps every request it gets, answers with the status it is told to, or holds requests
unanswered until released (a receiver that hangs)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Received:
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def delivery(self) -> str:
        return self.headers["X-Trainyard-Delivery"]


class Receiver:
    """What the server it runs got, and how it answers."""

    def __init__(self, status: int = 200, hang: bool = False) -> None:
        self.status = status
        self.hang = hang
        self.released = threading.Event()  # set: hanging requests are answered
        self.lock = threading.Lock()
        self.received: list[Received] = []
        self.hanging = 0  # requests held unanswered now
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def got(self) -> list[Received]:
        with self.lock:
            return list(self.received)

    def of_event(self, event: str) -> list[Received]:
        return [r for r in self.got() if r.headers["X-Trainyard-Event"] == event]

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with receiver.lock:
                    receiver.received.append(Received(dict(self.headers.items()), body))
                    hang = receiver.hang
                    receiver.hanging += hang
                if hang:
                    receiver.released.wait()
                    with receiver.lock:
                        receiver.hanging -= 1
                self.send_response(receiver.status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass  # the test's output stays the test's

        return Handler


@contextmanager
def receiving(receiver: Receiver | None = None, port: int = 0) -> Iterator[Receiver]:
    """Serve ``receiver`` on 127.0.0.1 (``port``, or a free one) until the block ends;
    hanging requests are released then, so every thread stops."""
    receiver = receiver or Receiver()
    server = ThreadingHTTPServer(("127.0.0.1", port), receiver._handler())
    server.daemon_threads = True
    receiver.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, name="webhook receiver")
    thread.start()
    try:
        yield receiver
    finally:
        receiver.released.set()
        server.shutdown()
        server.server_close()
        thread.join()
