"""Report metrics and progress from your own training script to Trainyard.

This module is on every script job's PYTHONPATH; it needs nothing but the standard
library, so it runs in any environment. Outside Trainyard (no TRAINYARD_METRICS_FILE)
``report`` does nothing, so a script that uses it still runs anywhere.

    import trainyard_job
    trainyard_job.report(step, epoch=epoch, total_steps=total, **{"train/loss": loss})

Each call appends one JSON line to $TRAINYARD_METRICS_FILE, which the worker follows.
Any process may call it (every DDP rank, say); the worker stores one value per metric
name and step, so report from rank 0 unless each rank reports different names.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

__all__ = ["report", "checkpoint_dir", "output_dir", "input_dir"]


def report(
    step: int,
    *,
    epoch: int | None = None,
    epochs: int | None = None,
    total_steps: int | None = None,
    **metrics: float,
) -> None:
    """Record metric values at a training step, and where the job is (for progress/ETA).

    Metric names may hold "/" (``**{"val/accuracy": 0.9}``); NaN and infinity are stored
    as null."""
    path = os.environ.get("TRAINYARD_METRICS_FILE")
    if not path:
        return
    line: dict[str, Any] = {"step": int(step)}
    for key, value in (("epoch", epoch), ("epochs", epochs), ("total_steps", total_steps)):
        if value is not None:
            line[key] = int(value)
    for name, number in metrics.items():
        x = float(number)  # a tensor's .item(), a numpy scalar
        line[name] = x if math.isfinite(x) else None
    data = (json.dumps(line) + "\n").encode()
    # One write on an O_APPEND descriptor: lines from several processes never interleave.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def checkpoint_dir() -> str | None:
    """Where to save checkpoints: kept across the job's attempts (a retried or preempted
    attempt finds what the last one saved). None outside Trainyard."""
    return os.environ.get("TRAINYARD_CHECKPOINT_DIR")


def output_dir() -> str | None:
    """Where to write results: what is here becomes the job's artifacts."""
    return os.environ.get("TRAINYARD_OUTPUT_DIR")


def input_dir() -> str | None:
    """Where the job's data files are, each under the name the job gave it."""
    return os.environ.get("TRAINYARD_INPUT_DIR")
