"""The database under contention: a submit load on the API while two workers write
progress, metrics and logs. Counts errors ("database is locked" above all) and rows lost.

    python -m benchmarks.contention [--seconds 60]
"""

from __future__ import annotations

import argparse
import math
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks.common import print_table, save
from tests.stack import Stack, running_stack, wait_for

SAMPLES, BATCH, EPOCHS, CHATTY = 2048, 64, 3, 2
JOB = {
    "recipe": "tiny",
    "devices": 1,
    "epochs": EPOCHS,
    "batch_size": BATCH,
    "params": {"samples": SAMPLES, "chatty": CHATTY},
}
STEPS = math.ceil(SAMPLES / BATCH) * EPOCHS
# train/loss every 10 steps, plus 4 points per epoch (epoch loss, lr, val loss, samples/s)
EXPECTED_METRICS = STEPS // 10 + 4 * EPOCHS


def run(stack: Stack, seconds: float, rate_per_s: float = 20.0, clients: int = 4) -> dict[str, Any]:
    """Submit at ``rate_per_s`` from ``clients`` threads for ``seconds``; then check every row."""
    stack.start_worker("a")
    stack.start_worker("b")
    statuses: list[int] = []
    ids: list[int] = []
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def submitter() -> None:
        with httpx.Client(base_url=stack.url + "/api/v1", timeout=30) as client:
            period = clients / rate_per_s
            next_at = time.monotonic()
            while next_at < stop:
                r = client.post("/jobs", json=JOB)
                with lock:
                    statuses.append(r.status_code)
                    if r.status_code == 201:
                        ids.append(r.json()["id"])
                next_at += period
                time.sleep(max(0.0, next_at - time.monotonic()))

    threads = [threading.Thread(target=submitter) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for job_id in ids:  # what did not start gets cancelled; what runs is let finish
        stack.http.post(f"/jobs/{job_id}/cancel")
    final = [stack.wait_status(i, {"succeeded", "failed", "cancelled"}, 300) for i in ids]
    wait_for(
        lambda: all(stack.job(i)["status"] in ("succeeded", "failed", "cancelled") for i in ids),
        60,
        "all ended",
    )

    succeeded = [j for j in final if j["status"] == "succeeded"]
    missing_metrics = missing_logs = metric_rows = log_rows = 0
    for job in succeeded:
        metrics = stack.http.get(f"/jobs/{job['id']}/metrics").json()
        logs = stack.http.get(f"/jobs/{job['id']}/logs", params={"limit": 10_000}).json()
        metric_rows += len(metrics)
        log_rows += len(logs)
        missing_metrics += max(0, EXPECTED_METRICS - len(metrics))
        printed = sum(1 for x in logs if x["text"].startswith("[rank 0] step line"))
        missing_logs += max(0, STEPS * CHATTY - printed)
        seqs = [x["seq"] for x in logs]  # event numbers: increasing (metrics share them)
        assert seqs == sorted(set(seqs)), f"job {job['id']}: log lines out of order"
    server_logs = "".join(p.read_text() for p in stack.tmp.glob("*.log"))
    return {
        "seconds": seconds,
        "submit_rate_per_s": rate_per_s,
        "submits": len(statuses),
        "submit_errors": sum(1 for s in statuses if s != 201),
        "jobs_found": sum(1 for i in ids if stack.http.get(f"/jobs/{i}").status_code == 200),
        "succeeded": len(succeeded),
        "failed": sum(1 for j in final if j["status"] == "failed"),
        "cancelled": sum(1 for j in final if j["status"] == "cancelled"),
        "metric_rows": metric_rows,
        "log_rows": log_rows,
        "missing_metric_rows": missing_metrics,
        "missing_log_lines": missing_logs,
        "database_locked_errors": server_logs.count("database is locked"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--rate", type=float, default=20.0, help="submits per second")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, running_stack(Path(tmp)) as stack:
        result = run(stack, args.seconds, args.rate)
    print_table("contention", [result])
    save("contention", result)


if __name__ == "__main__":
    main()
