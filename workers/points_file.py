"""Rank 0's progress and metric points on their way to the supervisor, which alone holds
the database's credentials: rank 0 appends them to ``.runner/attempt-<n>-points.jsonl``
and the supervisor's reporter follows that file into the store, fenced by the lease.

The file is the job's own writing, so the reader trusts nothing in it: a line that is
not a well-formed point of the right types and ranges is skipped (and counted), never
stored raw. A job can only ever report about itself: the fence is the supervisor's.

One JSON object per line, ``{"progress": {...}}`` or ``{"metric": {...}}``, with the
fields of ``service.points.ProgressPoint`` / ``MetricPoint``.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

from service.points import MetricPoint, ProgressPoint

log = logging.getLogger(__name__)

# How often rank 0's writer appends what it has (progress must refresh every second).
FLUSH_INTERVAL_S = 0.5
# A line past this is not a point (a metric name is at most 100 characters).
MAX_LINE_BYTES = 4096
MAX_INT = 2**31 - 1  # steps, epochs and totals are INTEGER columns
# How much of the file one look reads: the supervisor's reporter must not hold a whole
# week of points in memory after a long outage; the rest waits for the next look.
MAX_READ_BYTES = 4 * 2**20


def encode(point: MetricPoint | ProgressPoint) -> str:
    """The point as one line of the file."""
    kind = "progress" if isinstance(point, ProgressPoint) else "metric"
    return json.dumps({kind: point.as_dict()}, allow_nan=False) + "\n"


def decode(line: bytes) -> MetricPoint | ProgressPoint:
    """The point a line holds; ValueError when it holds none."""
    if len(line) > MAX_LINE_BYTES:
        raise ValueError(f"a line of {len(line)} bytes")
    obj = json.loads(line)
    if not isinstance(obj, dict) or len(obj) != 1:
        raise ValueError("not an object with one key")
    kind, fields = next(iter(obj.items()))
    if not isinstance(fields, dict):
        raise ValueError(f"{kind} is not an object")
    if kind == "metric":
        return MetricPoint(
            name=_str(fields, "name"),
            step=_int(fields, "step"),
            epoch=_int(fields, "epoch"),
            value=_number(fields, "value"),
            time=_required(_number(fields, "time"), "time"),
        )
    if kind == "progress":
        return ProgressPoint(
            epoch=_int(fields, "epoch"),
            epochs=_int(fields, "epochs"),
            step=_int(fields, "step"),
            total_steps=_int(fields, "total_steps"),
            loss=_number(fields, "loss"),
            samples_per_s=_number(fields, "samples_per_s"),
            eta_s=_number(fields, "eta_s"),
        )
    raise ValueError(f"unknown kind {kind!r}")


def _str(fields: dict[str, Any], key: str) -> str:
    value = fields.get(key)
    if not isinstance(value, str):
        raise ValueError(f"{key} is not a string")
    return value


def _int(fields: dict[str, Any], key: str) -> int:
    value = fields.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_INT:
        raise ValueError(f"{key} is not an integer from 0 to {MAX_INT}")
    return value


def _number(fields: dict[str, Any], key: str) -> float | None:
    value = fields.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{key} is not a number")
    return float(value)  # not finite: the point keeps None


def _required(value: float | None, key: str) -> float:
    if value is None:
        raise ValueError(f"{key} is missing")
    return value


class PointsReader:
    """The supervisor's side: the points appended since the last look, whole lines only.
    ``read_at(offset, limit)``: the file's bytes from there (None while there is no file);
    by default a plain read of ``path`` (the supervisor's reads it never through a link)."""

    def __init__(
        self, path: Path, read_at: Callable[[int, int], bytes | None] | None = None
    ) -> None:
        self.path = path
        self.read_at = read_at or self._read_at
        self.offset = 0
        self.skipped = 0  # lines that held no point

    def _read_at(self, offset: int, limit: int) -> bytes | None:
        try:
            with open(self.path, "rb") as f:
                f.seek(offset)
                return f.read(limit)
        except FileNotFoundError:
            return None

    def read(self) -> list[MetricPoint | ProgressPoint]:
        try:
            chunk = self.read_at(self.offset, MAX_READ_BYTES)
        except OSError as exc:  # a link in its place (the job's doing): nothing to read
            self.skipped += 1
            if self.skipped <= 3:
                log.warning("%s: not read (%s)", self.path, exc)
            return []
        if chunk is None:
            return []
        end = chunk.rfind(b"\n") + 1  # a line still being written waits for its end
        if end == 0 and len(chunk) >= MAX_READ_BYTES:
            end = len(chunk)  # no newline in a whole read: not a point, skip past it
            self.skipped += 1
        self.offset += end
        points: list[MetricPoint | ProgressPoint] = []
        for line in chunk[:end].splitlines():
            try:
                points.append(decode(line))
            # JSONDecodeError is a ValueError; a number past a float's range overflows,
            # and JSON nested deep enough exhausts the parser's recursion
            except (ValueError, OverflowError, RecursionError) as exc:
                self.skipped += 1
                if self.skipped <= 3:  # said a few times, not once per bad line
                    log.warning("%s: a line that holds no point skipped (%s)", self.path, exc)
        return points


class Batcher:
    """A queue the training loop (or a file's reader) puts points on, never blocking, and
    a thread that takes them every ``flush_interval_s`` (``_loop``): rank 0's writer here,
    the supervisor's reporter (``workers.supervisor.reporter``) there."""

    def __init__(self, name: str, flush_interval_s: float) -> None:
        self.flush_interval_s = flush_interval_s
        self.points: queue.SimpleQueue[MetricPoint | ProgressPoint] = queue.SimpleQueue()
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def put_nowait(self, item: MetricPoint | ProgressPoint) -> None:
        self.points.put_nowait(item)

    def start(self) -> Self:
        self._thread.start()
        return self

    def close(self) -> None:
        """Take care of what is left and stop the thread."""
        self._closing.set()
        self._thread.join()

    def _loop(self) -> None:
        raise NotImplementedError

    def _interval(self) -> bool:
        """Wait a whole interval (or until closed: True). Then everything queued meanwhile
        is taken at once: a wake-up per point would take the GIL from the training loop
        once per step (with a point every step: 0.81x)."""
        return self._closing.wait(self.flush_interval_s)

    def _take(
        self, progress: ProgressPoint | None, metrics: list[MetricPoint]
    ) -> tuple[ProgressPoint | None, list[MetricPoint]]:
        """Add what was queued to a batch; only the newest progress matters."""
        while True:
            try:
                item = self.points.get_nowait()
            except queue.Empty:
                return progress, metrics
            if isinstance(item, ProgressPoint):
                progress = item
            else:
                metrics.append(item)


class PointsWriter(Batcher):
    """Rank 0's side: the points it reports, appended to the file every interval."""

    def __init__(self, path: Path, *, flush_interval_s: float = FLUSH_INTERVAL_S) -> None:
        super().__init__("points-writer", flush_interval_s)
        self.path = path

    def start(self) -> Self:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        return super().start()

    def _loop(self) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            done = False
            while not done:
                done = self._interval()
                progress, metrics = self._take(None, [])
                lines = [encode(m) for m in metrics]
                if progress is not None:  # last: it sums up the points before it
                    lines.append(encode(progress))
                if lines:
                    os.write(fd, "".join(lines).encode())
        finally:
            os.close(fd)


@dataclass(frozen=True)
class PointsFile:
    """Where rank 0 reports, opened in the process it trains in (picklable for spawn)."""

    path: Path

    @contextmanager
    def open(self) -> Iterator[PointsWriter]:
        """A started writer; on leaving, what is left is appended."""
        writer = PointsWriter(self.path).start()
        try:
            yield writer
        finally:
            writer.close()
