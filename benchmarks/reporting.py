"""Reporting overhead: a fast training loop with a metric point every step, reporting into
the real database vs into nothing, alternated in one process.

    python -m benchmarks.reporting [--repeats 3]
"""

from __future__ import annotations

import argparse
import queue
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import print_table, save
from service import store
from service.db import make_engine
from service.migrate import upgrade
from service.models import JobCreate
from tests.stack import RECIPES_DIR
from workers import strategies, training
from workers.reporter import DbReporter
from workers.training import RunSpec

EPOCHS = 3
PARAMS = {"samples": 16384, "width": 8}  # tiny model: thousands of steps per second


def timed_run(tmp: Path, sink: Any, tag: str) -> float:
    spec = RunSpec(
        job_id=1, recipe="tiny", params=PARAMS, strategy="single", accelerator="cpu",
        devices=1, epochs=EPOCHS, batch_size=16, lr=1e-3, optimizer="adamw", seed=0,
        precision="fp32", checkpoint_every=EPOCHS, job_dir=str(tmp / tag),
        recipes_dir=str(RECIPES_DIR), threads=1,
    )  # fmt: skip
    start = time.perf_counter()
    strategies.run(spec, sink)
    return EPOCHS * PARAMS["samples"] / 16 / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rows = [measure(every, args.repeats) for every in (1, training.TRAIN_LOSS_EVERY_STEPS)]
    print_table(f"reporting (median of {args.repeats})", rows)
    save("reporting", rows)


def measure(every: int, repeats: int) -> dict[str, Any]:
    """Steps/s with and without reporting, a metric point every ``every`` steps."""
    training.TRAIN_LOSS_EVERY_STEPS = every
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        url = f"sqlite:///{tmp / 'r.db'}"
        upgrade(url)
        engine = make_engine(url)
        off, on = [], []
        for i in range(repeats):
            store.create_job(engine, JobCreate(recipe="tiny"))
            claimed = store.claim_job(
                engine, worker_id="w", free_devices=1, accelerator="cpu", recipes=["tiny"],
                lease_s=600,
            )  # fmt: skip
            assert claimed is not None and claimed.lease_token is not None
            fence = store.Fence(claimed.id, claimed.attempt, claimed.lease_token)  # type: ignore[arg-type]
            off.append(timed_run(tmp, queue.SimpleQueue(), f"off{i}"))
            reporter = DbReporter(engine, fence).start()
            on.append(timed_run(tmp, reporter, f"on{i}"))
            reporter.close()
    return {
        "metric_point_every_steps": every,
        "steps_per_s_off": statistics.median(off),
        "steps_per_s_on": statistics.median(on),
        "ratio": statistics.median(on) / statistics.median(off),
    }


if __name__ == "__main__":
    main()
