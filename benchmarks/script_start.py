"""A script job's start: from the submit to the script's first line, with a warm cache.

    python -m benchmarks.script_start [--rounds 10]

A running stack (API + worker, SQLite) runs a package whose script prints ``time.time()``
as its first line, as ``single`` (one process) and as ``ddp`` (torchrun, 2 ranks on
CPU: the later rank's first line). The package is unpacked by a first, untimed job (the
cache is warm after it). Beside each: the floor, the same command started by hand (a
fresh interpreter; ``torchrun`` for ddp). p50 and p90 over the rounds; goals: p50 <= 0.5 s
single, <= 1.5 s ddp.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

from benchmarks.common import print_table, save
from tests.stack import Stack, running_stack, wait_for

FIRST_LINE = "import time; print('first-line', time.time(), flush=True)\n"


def package(tmp: Path) -> Path:
    path = tmp / "start.zip"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("start.py", FIRST_LINE)
    return path


def upload(stack: Stack, path: Path) -> str:
    data = path.read_bytes()
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    assert stack.http.put(f"/blobs/{digest}", content=data).status_code in (200, 201)
    return digest


def first_lines(stack: Stack, job_id: int) -> list[float]:
    logs = stack.http.get(f"/jobs/{job_id}/logs", params={"limit": 1000}).json()
    return [float(x["text"].split()[-1]) for x in logs if "first-line" in x["text"]]


def run_job(stack: Stack, code: str, strategy: str) -> float:
    """Seconds from the submit to the (last rank's) first line."""
    devices = 2 if strategy == "ddp" else 1
    spec = {"code": code, "entrypoint": ["python", "start.py"], "accelerator": "cpu"}
    submitted = time.time()
    job = stack.submit(**spec, strategy=strategy, devices=devices)
    done = stack.wait_status(job["id"], {"succeeded", "failed"}, timeout_s=120)
    assert done["status"] == "succeeded", done
    lines = wait_for(lambda: len(t := first_lines(stack, job["id"])) == devices and t, 10, "lines")
    return max(lines) - submitted


def by_hand(tmp: Path, strategy: str) -> float:
    """The same first line, the command started by hand."""
    script = tmp / "start.py"
    script.write_text(FIRST_LINE)
    command = [sys.executable, str(script)]
    if strategy == "ddp":
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   "--nproc-per-node", "2", str(script)]  # fmt: skip
    started = time.time()
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    lines = [float(line.split()[-1]) for line in out.splitlines() if "first-line" in line]
    return max(lines) - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp, running_stack(Path(tmp)) as stack:
        stack.start_worker()
        code = upload(stack, package(Path(tmp)))
        run_job(stack, code, "single")  # unpacks the package: the cache is warm from here
        for strategy in ("single", "ddp"):
            job = [run_job(stack, code, strategy) for _ in range(args.rounds)]
            hand = [by_hand(Path(tmp), strategy) for _ in range(args.rounds)]
            rows.append({
                "strategy": strategy,
                "rounds": args.rounds,
                "job_p50_s": statistics.median(job),
                "job_p90_s": statistics.quantiles(job, n=10)[-1],
                "by_hand_p50_s": statistics.median(hand),
                "overhead_p50_s": statistics.median(job) - statistics.median(hand),
                "goal_s": 0.5 if strategy == "single" else 1.5,
            })  # fmt: skip
    print_table("submit -> the script's first line (warm cache)", rows)
    save("script_start", rows)


if __name__ == "__main__":
    main()
