"""What a training process reports while it runs, as typed records.

Rank 0 makes them, the runner's reporter batches them, the store writes them: one shape
from the training loop to the database, not tuples or loose dicts.

Here, and only here, is decided what a reported number and a metric's name may be: a
number is finite or None (JSON has no NaN or Infinity: the event stream's would not
parse, and PostgreSQL's json column refuses the row), and a name fits its column. The
points apply it as they are made, so nothing built from them can carry NaN to the
database or a watcher. Text a job writes is made storable here too (``storable_text``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

MAX_METRIC_NAME_CHARS = 100  # the metric table's name column


def finite(value: float | None) -> float | None:
    """The number as a float when it is finite; None for NaN, an infinity, or None."""
    if value is None:
        return None
    try:
        number = float(value)
    except OverflowError:  # an integer past a float's range
        return None
    return number if math.isfinite(number) else None


def finite_values(values: Mapping[str, float | None]) -> dict[str, float | None]:
    """Named numbers (a job's final metrics), each finite or None."""
    return {name: finite(value) for name, value in values.items()}


def finite_json(value: Any) -> Any:
    """A JSON-shaped value with every number in it finite or None (for what was stored
    before numbers were made finite here: SQLite kept a NaN in a JSON column)."""
    if isinstance(value, float):
        return finite(value)
    if isinstance(value, dict):
        return {key: finite_json(item) for key, item in value.items()}
    if isinstance(value, list):
        return [finite_json(item) for item in value]
    return value


def storable_text(text: str) -> str:
    """Text a job's processes wrote (log lines, an error's message), with each NUL as
    U+FFFD, as undecodable bytes are: PostgreSQL's text refuses NUL, and with it the
    whole write, again at every retry."""
    return text.replace("\x00", "\ufffd")


def metric_name(name: object) -> str:
    """The name, when it can name a stored series; ValueError saying why when it cannot."""
    if not isinstance(name, str) or not 0 < len(name) <= MAX_METRIC_NAME_CHARS:
        raise ValueError(f"a metric name must be 1 to {MAX_METRIC_NAME_CHARS} characters")
    if "\x00" in name:  # PostgreSQL's text refuses it, and with it the whole batch
        raise ValueError("a metric name must not contain a NUL character")
    return name


@dataclass(frozen=True, slots=True)
class MetricPoint:
    """One value of a named series at a training step (unique per job, name and step).

    Made with a name ``metric_name`` refuses: ValueError. A value that is not finite is
    kept as None, so the series shows the gap."""

    name: str
    step: int
    epoch: int
    value: float | None  # None: not finite (JSON has no NaN)
    time: float  # Unix seconds

    def __post_init__(self) -> None:
        metric_name(self.name)
        object.__setattr__(self, "value", finite(self.value))

    def as_dict(self) -> dict[str, Any]:
        # Spelled out: asdict() copies recursively, and this runs for every point stored.
        return {
            "name": self.name,
            "step": self.step,
            "epoch": self.epoch,
            "value": self.value,
            "time": self.time,
        }


@dataclass(frozen=True, slots=True)
class ProgressPoint:
    """Where a job is, as the API's ``progress`` shows it (numbers not finite: None)."""

    epoch: int
    epochs: int
    step: int
    total_steps: int
    loss: float | None = None
    samples_per_s: float | None = None  # steady training speed (training steps only)
    eta_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("loss", "samples_per_s", "eta_s"):
            object.__setattr__(self, name, finite(getattr(self, name)))

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
