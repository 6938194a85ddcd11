"""Start latency: submit -> running, and submit -> first training step.

    python -m benchmarks.latency [--jobs 10]

One job at a time on an idle worker. "running" is the claim's timestamp (started_at);
the first step is when the supervisor read the first line the recipe prints from inside
its first loss computation (tiny recipe, chatty=1). Both against the job's created_at.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from datetime import datetime
from pathlib import Path
from typing import Any

from benchmarks.common import database, print_table, save
from tests.stack import Stack, running_stack


def one(stack: Stack, strategy: str, devices: int) -> tuple[float, float]:
    job = stack.submit(
        recipe="tiny", strategy=strategy, devices=devices, accelerator="cpu", epochs=1,
        params={"samples": 256, "chatty": 1},
    )  # fmt: skip
    done = stack.wait_status(job["id"], {"succeeded", "failed"}, 120)
    assert done["status"] == "succeeded", done
    created = datetime.fromisoformat(done["created_at"]).timestamp()
    started = datetime.fromisoformat(done["started_at"]).timestamp()
    logs = stack.http.get(f"/jobs/{job['id']}/logs").json()
    first_step = min(x["time"] for x in logs if "step line 0" in x["text"])
    return started - created, first_step - created


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=10)
    parser.add_argument("--databases", default="sqlite,postgresql")
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    for kind in args.databases.split(","):
        with (
            tempfile.TemporaryDirectory() as tmp,
            database(kind) as url,
            running_stack(Path(tmp), url) as stack,
        ):
            stack.start_worker()
            rows += measure(stack, kind, args.jobs)
    print_table(f"start latency ({args.jobs} jobs each)", rows)
    save("latency", rows)


def measure(stack: Stack, kind: str, jobs: int) -> list[dict[str, Any]]:
    rows = []
    for strategy, devices in (("single", 1), ("ddp", 2)):
        one(stack, strategy, devices)  # warm-up: first fork after the zygote preloaded
        runs = [one(stack, strategy, devices) for _ in range(jobs)]
        to_running = [r[0] * 1000 for r in runs]
        to_step = [r[1] * 1000 for r in runs]
        rows.append({
            "database": kind,
            "strategy": f"{strategy}({devices})",
            "to_running_p50_ms": statistics.median(to_running),
            "to_running_p90_ms": pct(to_running, 0.9),
            "to_first_step_p50_ms": statistics.median(to_step),
            "to_first_step_p90_ms": pct(to_step, 0.9),
        })  # fmt: skip
    return rows


if __name__ == "__main__":
    main()
