"""How fast the worker recovers: a killed worker's job running again, and a cancel's
last process gone.

    python -m benchmarks.recovery [--runs 3]
"""

from __future__ import annotations

import argparse
import signal
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import print_table, save
from tests.stack import Stack, running_stack, wait_for
from workers.procfs import group_members

SLOW = {
    "recipe": "tiny",
    "strategy": "ddp",
    "devices": 2,
    "accelerator": "cpu",
    "epochs": 1000,
    "params": {"samples": 1024, "sleep_per_step_s": 0.01},
}
POLL_S = 0.01


def _training(stack: Stack, job_id: int) -> dict[str, Any]:
    return wait_for(lambda: (j := stack.job(job_id))["progress"] and j, 60, "training", POLL_S)


def worker_killed_then_restarted(stack: Stack) -> dict[str, float]:
    """kill -9 the worker, start it again at once: how long until the job trains again."""
    worker = stack.start_worker("w")
    job = stack.submit(**SLOW)
    _training(stack, job["id"])
    worker.send_signal(signal.SIGKILL)
    killed = time.monotonic()
    worker.wait()
    stack.start_worker("w")
    restarted = time.monotonic()
    wait_for(
        lambda: (j := stack.job(job["id"]))["attempt"] == 2 and j["status"] == "running",
        60,
        "attempt 2",
        POLL_S,
    )
    running = time.monotonic()
    wait_for(lambda: stack.job(job["id"])["progress"], 60, "attempt 2 progress", POLL_S)
    stepping = time.monotonic()
    stack.http.post(f"/jobs/{job['id']}/cancel")
    stack.wait_status(job["id"], {"cancelled"}, 60)
    return {
        "worker_restart_s": restarted - killed,
        "death_to_running_s": running - killed,
        "death_to_training_s": stepping - killed,
    }


def worker_killed_lease_expires(stack: Stack, lease_s: float) -> dict[str, float]:
    """kill -9 the worker and never restart it: another worker takes over after the lease."""
    knobs = {"lease_s": lease_s, "heartbeat_interval_s": 0.5}
    a = stack.start_worker("a", **knobs)
    job = stack.submit(**SLOW)
    _training(stack, job["id"])
    stack.start_worker("b", **knobs)
    a.send_signal(signal.SIGKILL)
    killed = time.monotonic()
    a.wait()
    wait_for(
        lambda: (j := stack.job(job["id"]))["worker_id"] == "b" and j["status"] == "running",
        120,
        "b",
        POLL_S,
    )
    running = time.monotonic()
    stack.http.post(f"/jobs/{job['id']}/cancel")
    stack.wait_status(job["id"], {"cancelled"}, 60)
    return {"lease_s": lease_s, "death_to_running_on_other_worker_s": running - killed}


def cancel_to_last_process(stack: Stack) -> dict[str, float]:
    """POST cancel on a training DDP job: until no process is left, and until 'cancelled'."""
    stack.start_worker("w")
    job = stack.submit(**SLOW)
    _training(stack, job["id"])
    pgid = stack.runner_pgid(job["id"])
    start = time.monotonic()
    stack.http.post(f"/jobs/{job['id']}/cancel")
    wait_for(lambda: group_members(pgid) == [], 60, "processes gone", POLL_S)
    gone = time.monotonic()
    stack.wait_status(job["id"], {"cancelled"}, 60)
    return {
        "cancel_to_last_process_s": gone - start,
        "cancel_to_cancelled_s": time.monotonic() - start,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--lease-s", type=float, default=15.0)
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    for name, scenario in (
        ("restart", worker_killed_then_restarted),
        ("lease", lambda s: worker_killed_lease_expires(s, args.lease_s)),
        ("cancel", cancel_to_last_process),
    ):
        runs = []
        for _ in range(args.runs):
            with tempfile.TemporaryDirectory() as tmp, running_stack(Path(tmp)) as stack:
                runs.append(scenario(stack))
        rows.append(
            {"scenario": name, **{k: statistics.median(r[k] for r in runs) for k in runs[0]}}
        )
    print_table(f"recovery (median of {args.runs})", rows)
    save("recovery", rows)


if __name__ == "__main__":
    main()
