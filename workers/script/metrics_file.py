"""A script's metrics: JSON lines it appends to ``$TRAINYARD_METRICS_FILE``, followed by the
runner and stored exactly like a recipe's points (the same endpoints, event stream, chart).

A line is an object with an integer ``step`` and named numbers, plus optional ``epoch``,
``epochs`` and ``total_steps`` for progress and ETA::

    {"step": 120, "epoch": 1, "total_steps": 900, "train/loss": 0.31, "val/accuracy": 0.9}

A line without ``epoch``, ``epochs`` or ``total_steps`` is where the last line that said
them left it (a script that reports a metric alone does not send the job back to epoch
0). A malformed line is logged and skipped; a value that is null or not finite (NaN,
Infinity: Python's json writes them) is stored as null.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

from service.points import MetricPoint, ProgressPoint, finite, metric_name
from workers.rate import StepRate

log = logging.getLogger(__name__)

# Keys that say where the job is; every other key is a metric.
POSITION = ("step", "epoch", "epochs", "total_steps", "time")
CARRIED = ("epoch", "epochs", "total_steps")  # a line that leaves them out keeps the last
MAX_LINE_BYTES = 64 * 1024
MAX_INT = 2**31 - 1  # steps and epochs are INTEGER columns


class Sink(Protocol):
    def put_nowait(self, item: MetricPoint | ProgressPoint) -> None: ...


class MetricsFile:
    """Reads the complete lines appended to a file since the last look."""

    def __init__(self, path: Path, sink: Sink) -> None:
        self.path = path
        self.sink = sink
        self.offset = 0
        self.rate = StepRate(min_steps=1)  # for the ETA
        self.skipped = 0
        self.latest: dict[str, float | None] = {}  # each metric's last value
        self.position: dict[str, Any] = {}  # the last epoch, epochs, total_steps said

    def poll(self) -> int:
        """Store the points of every complete new line; returns how many lines were read."""
        lines = 0
        for line in self._new_lines():
            lines += 1
            self._take(line)
        return lines

    def final(self) -> dict[str, float]:
        """Each metric's last finite value: a finished script job's ``result``."""
        return {name: v for name, v in self.latest.items() if v is not None}

    def _new_lines(self) -> Iterator[bytes]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return
        end = data.rfind(b"\n") + 1  # a line still being written waits for its newline
        if end == 0 and len(data) > MAX_LINE_BYTES:
            end = len(data)  # one endless line: skipped whole
        self.offset += end
        yield from data[:end].splitlines()

    def _take(self, raw: bytes) -> None:
        if not raw.strip():
            return
        try:
            if len(raw) > MAX_LINE_BYTES:
                raise ValueError(f"longer than {MAX_LINE_BYTES} bytes")
            line = json.loads(raw)
            if isinstance(line, dict):
                said = {k: line[k] for k in CARRIED if line.get(k) is not None}
                line = {**line, **{k: v for k, v in self.position.items() if k not in said}}
            points, progress = parse(line, now=time.time())
        except ValueError as exc:
            self.skipped += 1
            log.warning("metrics file: line skipped (%s): %.200r", exc, raw)
            return
        self.position.update(said)  # (a dict: parse refused anything else)
        for point in points:
            self.latest[point.name] = point.value
            self.sink.put_nowait(point)
        rate = self.rate.mark(time.monotonic(), progress.step)
        if rate is not None and progress.total_steps > progress.step:
            eta = round((progress.total_steps - progress.step) / rate, 3)
            progress = replace(progress, eta_s=eta)
        self.sink.put_nowait(progress)


def parse(line: Any, *, now: float) -> tuple[list[MetricPoint], ProgressPoint]:
    """A line's metric points and the progress it shows; ValueError if it is malformed."""
    if not isinstance(line, dict):
        raise ValueError("not a JSON object")
    step = _integer(line, "step", required=True)
    epoch = _integer(line, "epoch")
    points = []
    for name, value in line.items():
        if name in POSITION:
            continue
        metric_name(name)  # ValueError: the line is skipped, and says why
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise ValueError(f"{name!r} is not a number")
        points.append(MetricPoint(name=name, step=step, epoch=epoch, value=finite(value), time=now))
    loss = next((p.value for p in points if p.name in ("train/loss", "loss")), None)
    progress = ProgressPoint(
        epoch=epoch,
        epochs=_integer(line, "epochs"),
        step=step,
        total_steps=_integer(line, "total_steps"),
        loss=loss,
    )
    return points, progress


def _integer(line: dict[str, Any], key: str, *, required: bool = False) -> int:
    value = line.get(key)
    if value is None and not required:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_INT:
        raise ValueError(f"{key!r} must be an integer from 0 to {MAX_INT}")
    return value
