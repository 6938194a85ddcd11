"""One job across boxes against the same job on one box, on this machine (CPU, loopback).

    python -m benchmarks.multi_node [--rounds 3] [--epochs 4]

Two workers stand for two boxes: each pinned to one core (its box's CPU), with one
CPU slot, its own data folder, and the shared folder; a third worker, on both cores with
two slots and no shared folder, is the one box. The same ddp job (mlp-regression, the
same seed) runs as 2 nodes x 1 rank, then as 1 node x 2 ranks, in turns, one job at a
time: every rank trains with one thread either way, and the ranks meet over loopback with
gloo either way.

- samples/s: global rank 0's training speed between its first and last ``train/loss``
  points (steps x batch / seconds), the ratio across boxes / one box.
- claim to first step: from the claim (for a job across boxes, the moment its gang was
  whole: ``started_at``) to the first step's line (the tiny recipe prints one from inside
  its first loss), p50 over the rounds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

from benchmarks.common import database, print_table, save
from tests.stack import Stack, running_stack

TRAIN = {
    "recipe": "mlp-regression",
    "strategy": "ddp",
    "accelerator": "cpu",
    "batch_size": 64,
    "seed": 3,
    "params": {"hidden": 256, "layers": 3, "features": 64, "train_samples": 16384},
}
FIRST_STEP = {
    "recipe": "tiny",
    "strategy": "ddp",
    "accelerator": "cpu",
    "epochs": 1,
    "params": {"samples": 256, "chatty": 1},
}


@contextmanager
def pinned(cores: set[int]) -> Iterator[None]:
    """Processes started meanwhile run on ``cores`` only (they inherit the affinity)."""
    everything = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cores)
    try:
        yield
    finally:
        os.sched_setaffinity(0, everything)


def samples_per_s(stack: Stack, job_id: int) -> float:
    points = stack.http.get(f"/jobs/{job_id}/metrics", params={"name": "train/loss"}).json()
    first, last = points[0], points[-1]
    return float(
        (last["step"] - first["step"]) * TRAIN["batch_size"] / (last["time"] - first["time"])
    )


def claim_to_first_step(stack: Stack, job: dict[str, Any]) -> float:
    started = datetime.fromisoformat(job["started_at"]).timestamp()
    logs = stack.http.get(f"/jobs/{job['id']}/logs", params={"limit": 10_000}).json()
    return float(min(x["time"] for x in logs if "step line 0" in x["text"]) - started)


def run(stack: Stack, spec: dict[str, Any], layout: dict[str, int]) -> dict[str, Any]:
    job = stack.submit(**spec, **layout)
    done = stack.wait_status(job["id"], {"succeeded", "failed"}, 600)
    assert done["status"] == "succeeded", done
    return done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument(
        "--no-pin",
        dest="pin",
        action="store_false",
        help="the two boxes' workers share both cores (two slots each, so each rank still "
        "trains with one thread) instead of one core each",
    )
    args = parser.parse_args()
    if len(os.sched_getaffinity(0)) < 2:
        raise SystemExit("needs two cores: one per box")
    layouts = {"2 nodes x 1": {"nodes": 2, "devices": 1}, "1 node x 2": {"nodes": 1, "devices": 2}}
    speed: dict[str, list[float]] = {name: [] for name in layouts}
    first: dict[str, list[float]] = {name: [] for name in layouts}
    with (
        tempfile.TemporaryDirectory() as tmp,
        database("postgresql") as url,
        running_stack(Path(tmp), url) as stack,
    ):
        for box, core in (("box0", 0), ("box1", 1)):
            with pinned({core} if args.pin else {0, 1}):
                stack.start_worker(
                    box,
                    env={"TRAINYARD_DATA_DIR": str(Path(tmp) / box)},
                    cpu_slots=1 if args.pin else 2,
                    shared_dir=Path(tmp) / "shared",
                )
        with pinned({0, 1}):
            stack.start_worker("onebox", cpu_slots=2)
        for _ in range(args.rounds):
            for name, layout in layouts.items():  # in turns: the machine's noise hits both
                speed[name].append(
                    samples_per_s(stack, run(stack, {**TRAIN, "epochs": args.epochs}, layout)["id"])
                )
                first[name].append(claim_to_first_step(stack, run(stack, FIRST_STEP, layout)))
    rows = [
        {
            "layout": name,
            "samples/s (median)": statistics.median(speed[name]),
            "samples/s (each)": " ".join(f"{v:.0f}" for v in speed[name]),
            "claim to first step p50 (s)": statistics.median(first[name]),
        }
        for name in layouts
    ]
    ratio = statistics.median(
        a / b for a, b in zip(speed["2 nodes x 1"], speed["1 node x 2"], strict=True)
    )
    rows.append(
        {"layout": "ratio, across boxes / one box (median of turns)", "samples/s (median)": ratio}
    )
    where = "on a core each" if args.pin else "sharing both cores"
    print_table(f"one job across boxes ({args.rounds} rounds, boxes {where})", rows)
    save("multi_node" if args.pin else "multi_node-unpinned", rows)


if __name__ == "__main__":
    main()
