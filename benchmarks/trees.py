"""A benchmark in two trees side by side: an earlier commit's and this one's, in turns, in
one run (the machine is shared and noisy: never two runs an hour apart).

    python -m benchmarks.trees REF BENCHMARK [ARGS...] [--turns 3]

REF is checked out with ``git worktree`` into a temporary folder; each turn runs the
benchmark once in each tree (the order alternating), with this virtualenv, and reads the
JSON it saved. Printed: each figure's median over the turns in each tree, and the ratio
new / old. Figures are the numbers in the benchmark's JSON rows, keyed by the row's text
fields (strategy, database, ...).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.common import print_table, save

REPO = Path(__file__).resolve().parents[1]


def run_in(tree: Path, benchmark: str, args: list[str]) -> list[dict[str, Any]]:
    """Run ``benchmark`` in ``tree``; the rows of the JSON it saved."""
    before = set((tree / "benchmarks" / "results").glob("*.json"))
    stamp = {p: p.stat().st_mtime for p in before}
    env = {**os.environ, "PYTHONPATH": str(tree)}
    subprocess.run(
        [sys.executable, "-m", f"benchmarks.{benchmark}", *args], cwd=tree, env=env, check=True
    )
    results = sorted(
        (
            p
            for p in (tree / "benchmarks" / "results").glob("*.json")
            if stamp.get(p) != p.stat().st_mtime
        ),
        key=lambda p: p.stat().st_mtime,
    )
    rows: list[dict[str, Any]] = []
    for path in results:
        result = json.loads(path.read_text())["result"]
        rows += result if isinstance(result, list) else [result]
    return rows


def figures(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Every number of every row, named by the row's text fields and the number's key."""
    out = {}
    for row in rows:
        label = " ".join(str(v) for v in row.values() if isinstance(v, str))
        for key, value in row.items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                out[f"{label} {key}".strip()] = float(value)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("ref", help="the earlier commit")
    parser.add_argument("benchmark")
    parser.add_argument("--turns", type=int, default=3)
    known, rest = parser.parse_known_args()
    old = Path(tempfile.mkdtemp(prefix="trainyard-old-"))
    subprocess.run(
        ["git", "worktree", "add", "--detach", str(old), known.ref], cwd=REPO, check=True
    )
    seen: dict[str, dict[str, list[float]]] = {"old": {}, "new": {}}
    try:
        for turn in range(known.turns):
            trees = [("old", old), ("new", REPO)]
            for name, tree in trees if turn % 2 == 0 else trees[::-1]:
                for key, value in figures(run_in(tree, known.benchmark, rest)).items():
                    seen[name].setdefault(key, []).append(value)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(old)], cwd=REPO, check=False)
        shutil.rmtree(old, ignore_errors=True)
    rows = []
    for key in seen["new"]:
        if key not in seen["old"]:
            continue
        a, b = statistics.median(seen["old"][key]), statistics.median(seen["new"][key])
        rows.append({"figure": key, "old": a, "new": b, "new/old": b / a if a else None})
    title = f"{known.benchmark}: {known.ref} against this tree, {known.turns} turns"
    print_table(title, rows)
    save(f"trees-{known.benchmark}", {"ref": known.ref, "turns": known.turns, "rows": rows})


if __name__ == "__main__":
    main()
