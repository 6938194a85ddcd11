"""Shared by the benchmarks: results as a table on stdout and JSON in benchmarks/results/."""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.databases import throwaway_postgres

RESULTS = Path(__file__).parent / "results"


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "date": time.strftime("%Y-%m-%d"),
    }


def save(name: str, result: Any) -> Path:
    """Write ``benchmarks/results/<name>.json``."""
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps({"machine": machine(), "result": result}, indent=2) + "\n")
    return path


def print_table(title: str, rows: list[dict[str, Any]]) -> None:
    """A plain fixed-width table."""
    if not rows:
        return
    cols = list(dict.fromkeys(k for row in rows for k in row))
    cells = [[_fmt(r.get(c, "")) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    print(f"\n## {title}")
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)))
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)))


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


@contextmanager
def database(kind: str) -> Iterator[str | None]:
    """A migrated database URL of this kind for one benchmark (None: the stack's own
    SQLite file); a PostgreSQL one is created on TRAINYARD_TEST_POSTGRES and dropped."""
    if kind == "sqlite":
        yield None
    elif kind == "postgresql":
        with throwaway_postgres() as url:
            yield url
    else:
        raise SystemExit(f"unknown database {kind!r}: sqlite or postgresql")
