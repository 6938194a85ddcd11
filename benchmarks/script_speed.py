"""A script job's steady training speed against the same script started by hand.

    python -m benchmarks.script_speed [--rounds 5] [--steps 4000]

The script trains an MLP on synthetic data for ``--steps`` steps, reporting each step's
loss through ``trainyard_job.report`` (the metrics file the runner follows) and printing
a line every 10 steps (the log the worker stores), and measures its own samples/s after
a warm-up. It runs as a job (single, one CPU slot of two: one thread, as the worker
gives it) and by hand with the same thread count; they alternate, by hand first in even
rounds; the ratio (job over by hand) is taken per round, median over rounds. Goal >= 0.98.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

from benchmarks.common import print_table, save
from tests.stack import Stack, running_stack
from workers.script.job import JOB_PATH

SCRIPT = """
import json, os, sys, time
import torch
from torch import nn
try:
    import trainyard_job
except ImportError:
    trainyard_job = None
steps, warmup, batch = int(sys.argv[1]), 100, 256
torch.manual_seed(0)
x, y = torch.randn(8192, 64), torch.randn(8192, 1)
hidden = [nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU()]
model = nn.Sequential(*hidden, nn.Linear(256, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(steps):
    if step == warmup:
        start = time.perf_counter()
    i = (step * batch) % 8192
    loss = nn.functional.mse_loss(model(x[i:i + batch]), y[i:i + batch])
    opt.zero_grad(); loss.backward(); opt.step()
    if trainyard_job:
        trainyard_job.report(step, total_steps=steps, **{"train/loss": loss.item()})
    if step % 10 == 0:
        print(f"step {step} loss {loss.item():.4f}")
rate = (steps - warmup) * batch / (time.perf_counter() - start)
out = os.environ.get("TRAINYARD_OUTPUT_DIR", ".")
with open(os.path.join(out, "speed.json"), "w") as f:
    json.dump({"samples_per_s": rate}, f)
"""


def upload_package(stack: Stack, tmp: Path) -> str:
    path = tmp / "speed.zip"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("speed.py", SCRIPT)
    data = path.read_bytes()
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    assert stack.http.put(f"/blobs/{digest}", content=data).status_code in (200, 201)
    return digest


def as_job(stack: Stack, code: str, steps: int) -> float:
    spec = {"code": code, "entrypoint": ["python", "speed.py", str(steps)], "accelerator": "cpu"}
    job = stack.submit(**spec)
    done = stack.wait_status(job["id"], {"succeeded", "failed"}, timeout_s=600)
    assert done["status"] == "succeeded", done
    speed = stack.tmp / "data" / "jobs" / str(job["id"]) / "output" / "speed.json"
    return float(json.loads(speed.read_text())["samples_per_s"])


def by_hand(tmp: Path, steps: int) -> float:
    script = tmp / "speed.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(JOB_PATH)}
    env["TRAINYARD_OUTPUT_DIR"] = str(tmp)
    env["TRAINYARD_METRICS_FILE"] = str(tmp / "metrics.jsonl")  # written, followed by none
    subprocess.run([sys.executable, str(script), str(steps)], env=env, check=True,
                   stdout=subprocess.DEVNULL)  # fmt: skip
    return float(json.loads((tmp / "speed.json").read_text())["samples_per_s"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=4000)
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp, running_stack(Path(tmp)) as stack:
        stack.start_worker()
        code = upload_package(stack, Path(tmp))
        as_job(stack, code, 120)  # warm: the package unpacked, the zygote up
        for round_ in range(args.rounds):
            runs = {"hand": lambda: by_hand(Path(tmp), args.steps),
                    "job": lambda: as_job(stack, code, args.steps)}  # fmt: skip
            order = ["hand", "job"] if round_ % 2 == 0 else ["job", "hand"]
            got = {name: runs[name]() for name in order}
            rows.append({
                "round": round_ + 1,
                "by_hand_samples_s": got["hand"],
                "job_samples_s": got["job"],
                "job_vs_by_hand": got["job"] / got["hand"],
            })  # fmt: skip
    summary = {
        "rounds": len(rows),
        "median_ratio": statistics.median(r["job_vs_by_hand"] for r in rows),
    }
    print_table("a script's samples/s: as a job vs by hand (1 thread each)", rows)
    print_table("median", [summary])
    save("script_speed", {"summary": summary, "rounds": rows})


if __name__ == "__main__":
    main()
