"""Reading a Server-Sent Events stream line by line (the job's event stream)."""

from __future__ import annotations

import json

from trainyard.models import Event


class EventParser:
    """Feed it the stream's lines; it returns each event as its blank line ends it."""

    def __init__(self) -> None:
        self._id: int | None = None
        self._kind = "message"
        self._data: list[str] = []

    def line(self, line: str) -> Event | None:
        if not line:
            return self._dispatch()
        if line.startswith(":"):  # a comment: the server's keep-alive
            return None
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "id" and value.isdigit():
            self._id = int(value)
        elif name == "event":
            self._kind = value
        elif name == "data":
            self._data.append(value)
        return None

    def _dispatch(self) -> Event | None:
        event = None
        if self._data:
            text = "\n".join(self._data)
            data = json.loads(text) if text else {}
            event = Event(id=self._id, kind=self._kind, data=data if isinstance(data, dict) else {})
        self._id, self._kind, self._data = None, "message", []
        return event
