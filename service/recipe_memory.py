"""What a recipe's params ask of memory, as far as the recipe itself says.

The API never runs recipe code, so a recipe states its size in its params' JSON Schema,
under ``MEMORY_KEY``: the values it holds in memory as a sum of products of its params
(and whole numbers), and the bytes of each value. The built-in MLPs say:

    {"bytes_per_value": 4,
     "terms": [["features", "train_samples"], ..., [4, "hidden", "hidden", "layers"]]}

That is a floor (building the data takes temporaries, training takes activations), so
what it refuses is surely too big: the submit compares it with the most memory a worker
offers one process of the job.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

# The JSON Schema extension keyword (unknown keywords are ignored by validators).
MEMORY_KEY = "x-trainyard-memory"
MIB = 2**20


@dataclass(frozen=True)
class Estimate:
    """The bytes a job's every process holds at least, and how they were counted."""

    bytes: int
    formula: str  # "(features×train_samples + features×val_samples) × 4 bytes"
    fields: list[str]  # the params it counts, in order of appearance


def estimate(schema: dict[str, Any], params: dict[str, Any]) -> Estimate | None:
    """The recipe's own estimate for these (validated) params; None if it gives none."""
    spec = schema.get(MEMORY_KEY)
    if not isinstance(spec, dict):
        return None
    defaults = {k: v.get("default") for k, v in schema.get("properties", {}).items()}
    values = {**defaults, **params}
    terms: list[list[str | int]] = spec.get("terms", [])
    per_value = int(spec.get("bytes_per_value", 4))
    try:
        count = sum(
            math.prod(f if isinstance(f, int) else int(values[f]) for f in term) for term in terms
        )
    except (KeyError, TypeError, ValueError):  # a term naming no numeric param: no guess
        return None
    fields = list(dict.fromkeys(f for term in terms for f in term if isinstance(f, str)))
    formula = " + ".join("×".join(map(str, term)) for term in terms)
    return Estimate(count * per_value, f"({formula}) × {per_value} bytes", fields)


def size(n_bytes: float) -> str:
    """1.5 GiB, 2.4 TiB: the figure people read."""
    # A recipe's unbounded params can make an int no float holds: say "more than" then.
    if n_bytes > 2**100:
        return "more than 2^100 bytes"
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if n_bytes < 1024 or unit == "TiB":
            return f"{n_bytes:.1f} {unit}" if unit != "bytes" else f"{n_bytes:.0f} bytes"
        n_bytes /= 1024
    raise AssertionError("unreachable")


def offered_per_process(devices: list[dict[str, Any]], wanted: int, processes: int) -> int | None:
    """The most memory a worker with these devices gives each process of a job on
    ``wanted`` of them (its largest ones); None if it does not say (an older worker)."""
    sizes: list[int] = [d["memory_mb"] for d in devices if isinstance(d.get("memory_mb"), int)]
    if not sizes or len(sizes) < len(devices):
        return None
    largest = sorted(sizes, reverse=True)[:wanted]
    return sum(largest) * MIB // max(processes, 1)
