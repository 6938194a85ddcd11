"""Trainyard against the bare script, side by side: steady-state samples/s and wall time.

    python -m benchmarks.overhead [--repeats 3]

Two bare scripts: the usual one (the DataLoader fetching sample by sample, as people write
it) and the same script fetching whole batches as Trainyard's loop does. The first ratio
is what a user gains or loses by submitting to Trainyard; the second, like for like, is
what the service itself costs.

Steady state: samples per epoch over the median epoch time, first epoch left out (warm-up).
For Trainyard, epoch ends are the val/loss metric times. Whole run: bare = the script's
process from start to exit; Trainyard = submit to succeeded (the job's own timestamps),
the job followed on its event stream meanwhile. The three runs alternate, so drift in
the machine's load hits each alike; each repeat's ratios are kept, not only the medians.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from benchmarks.common import print_table, save
from tests.stack import REPO, running_stack

EPOCHS, BATCH, HIDDEN, LAYERS, SAMPLES = 5, 256, 256, 3, 65536


def bare(world: int, fetch: str) -> tuple[float, float]:
    """(steady samples/s, wall s) of the hand-written script."""
    start = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.bare_ddp", "--world", str(world),
         "--epochs", str(EPOCHS), "--batch", str(BATCH), "--hidden", str(HIDDEN),
         "--layers", str(LAYERS), "--samples", str(SAMPLES), "--fetch", fetch],
        cwd=REPO, check=True, capture_output=True, text=True,
    )  # fmt: skip
    wall = time.perf_counter() - start
    times = json.loads(out.stdout.strip().splitlines()[-1])["epoch_times"]
    return SAMPLES / statistics.median(times[1:]), wall


def trainyard(world: int, tmp: Path) -> tuple[float, float]:
    """(steady samples/s, submit-to-succeeded s) of the same training as a Trainyard job."""
    # A worker with one slot per job process, so each process gets the cores the bare
    # script's processes get.
    with running_stack(tmp, cpu_slots=world) as stack:
        stack.start_worker()
        spec = {
            "recipe": "mlp-regression", "strategy": "ddp" if world > 1 else "single",
            "devices": world, "accelerator": "cpu", "epochs": EPOCHS, "batch_size": BATCH,
            "checkpoint_every": EPOCHS,  # the bare script does not checkpoint either
            "params": {"hidden": HIDDEN, "layers": LAYERS, "train_samples": SAMPLES},
        }  # fmt: skip
        job = stack.submit(**spec)
        # Follow the job's event stream until it ends, as `trainyard submit --follow` does:
        # polling the API every 50 ms took CPU from the very training being measured.
        stack.events(job["id"])
        done = stack.job(job["id"])
        assert done["status"] == "succeeded", done
        stamps = [datetime.fromisoformat(done[k]) for k in ("created_at", "finished_at")]
        wall = (stamps[1] - stamps[0]).total_seconds()  # submit to succeeded, server clock
        ends = [
            m["time"]
            for m in stack.http.get(
                f"/jobs/{job['id']}/metrics", params={"name": "val/loss"}
            ).json()
        ]
        epoch_times = [b - a for a, b in zip(ends, ends[1:], strict=False)]
        return SAMPLES / statistics.median(epoch_times), wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    for world in (1, 2):
        runs: list[dict[str, tuple[float, float]]] = []
        for _ in range(args.repeats):  # alternate, so drift in machine load hits all three
            run = {"usual": bare(world, "per-sample"), "batched": bare(world, "batched")}
            with tempfile.TemporaryDirectory() as tmp:
                run["trainyard"] = trainyard(world, Path(tmp))
            runs.append(run)
        median = functools.partial(_median, runs)
        rows.append({
            "strategy": "ddp(2)" if world > 1 else "single",
            "bare_samples_per_s": median("usual", 0),
            "bare_batched_samples_per_s": median("batched", 0),
            "trainyard_samples_per_s": median("trainyard", 0),
            "ratio_vs_usual": median("trainyard", 0) / median("usual", 0),
            "ratio_like_for_like": median("trainyard", 0) / median("batched", 0),
            "like_for_like_each": [round(r["trainyard"][0] / r["batched"][0], 3) for r in runs],
            "bare_wall_s": median("usual", 1), "bare_batched_wall_s": median("batched", 1),
            "trainyard_wall_s": median("trainyard", 1),
            "wall_ratio_like_for_like": median("trainyard", 1) / median("batched", 1),
        })  # fmt: skip
    print_table(f"overhead (median of {args.repeats}, CPU)", rows)
    save("overhead", rows)


def _median(runs: list[dict[str, tuple[float, float]]], kind: str, i: int) -> float:
    """Median over the repeats of one figure (0: samples/s, 1: wall s) of one kind of run."""
    return statistics.median(r[kind][i] for r in runs)


if __name__ == "__main__":
    main()
