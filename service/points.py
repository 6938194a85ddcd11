"""What a training process reports while it runs, as typed records.

Rank 0 makes them, the runner's reporter batches them, the store writes them: one shape
from the training loop to the database, not tuples or loose dicts.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class MetricPoint:
    """One value of a named series at a training step (unique per job, name and step)."""

    name: str
    step: int
    epoch: int
    value: float | None  # None: not finite (JSON has no NaN)
    time: float  # Unix seconds

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
    """Where a job is, as the API's ``progress`` shows it."""

    epoch: int
    epochs: int
    step: int
    total_steps: int
    loss: float | None = None
    samples_per_s: float | None = None  # steady training speed (training steps only)
    eta_s: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
