"""Footprint: API start time and memory (it must never import torch); worker start time
(process start to its first claim, a job already waiting) and idle memory.

python -m benchmarks.footprint
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from benchmarks.common import print_table, save
from benchmarks.turns import descendants
from tests.stack import running_stack, wait_for


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        began = time.perf_counter()
        with running_stack(Path(tmp)) as stack:
            api_start = time.perf_counter() - began  # process start to /healthz answering
            api = stack.procs[0]
            maps = Path(f"/proc/{api.pid}/maps").read_text()
            job = stack.submit(recipe="tiny", epochs=1)  # waiting when the worker starts
            started = time.perf_counter()
            worker = stack.start("worker", "--worker-id", "footprint", log_name="worker-footprint")
            wait_for(lambda: stack.job(job["id"])["status"] != "queued", 60, "the claim")
            worker_start = time.perf_counter() - started
            stack.wait_status(job["id"], {"succeeded"})
            time.sleep(2)  # idle: the zygote has preloaded, nothing runs
            zygotes = wait_for(lambda: descendants([worker.pid]) - {worker.pid}, 10, "the zygote")
            result = {
                "api_start_s": api_start,
                "api_rss_mb": rss_mb(api.pid),
                "api_loaded_torch": "libtorch" in maps,
                "worker_start_to_claim_s": worker_start,
                "worker_rss_mb": rss_mb(worker.pid),
                "zygote_rss_mb": sum(rss_mb(p) for p in zygotes),
            }
    print_table("footprint", [result])
    save("footprint", result)


if __name__ == "__main__":
    main()
