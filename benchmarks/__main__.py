"""`make bench`: every benchmark in turn (tables on stdout, JSON in benchmarks/results/)."""

from __future__ import annotations

import subprocess
import sys

BENCHMARKS = [
    ["footprint"],
    ["claims"],
    ["fair_share"],
    ["listing"],
    ["client"],
    ["latency"],
    ["overhead"],
    ["reporting"],
    ["api"],
    ["api", "--database", "postgresql"],
    ["contention"],
    ["recovery"],
    ["upload"],
    ["storage"],
    ["script_start"],
    ["script_speed"],
    ["multi_node"],
    ["multi_node", "--no-pin"],
    ["sweeps"],
]

if __name__ == "__main__":
    chosen = [[name] for name in sys.argv[1:]] or BENCHMARKS
    for name, *args in chosen:
        subprocess.run([sys.executable, "-m", f"benchmarks.{name}", *args], check=True)
