"""API throughput and latency: POST /jobs and GET /jobs/{id} under 1, 16 and 64 clients.

    python -m benchmarks.api [--seconds 10]
    python -m benchmarks.api --first-worker [--seconds 10]   (submits before and after
        the first worker registers, 16 clients, alternating)

Load comes from wrk (Debian package `wrk`) on the same two cores as the server, with a
worker running and busy (its slots held by a slow job, so submits stay queued).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from sqlalchemy import text

from benchmarks.common import database, print_table, save
from tests.stack import Stack, running_stack, wait_for

JOB = {"recipe": "mlp-regression", "epochs": 1}
BUSY = {
    "recipe": "tiny", "strategy": "ddp", "devices": 2, "epochs": 100000,
    "params": {"sleep_per_step_s": 0.05},
}  # fmt: skip
POST_LUA = """
wrk.method = "POST"
wrk.body = '{body}'
wrk.headers["Content-Type"] = "application/json"
"""


def wrk(url: str, clients: int, seconds: float, script: Path | None) -> dict[str, Any]:
    threads = "2" if clients > 1 else "1"
    cmd = ["wrk", "-t", threads, "-c", str(clients), "-d", f"{max(1, round(seconds))}s"]
    cmd += ["--latency", "--timeout", "10s", *(["-s", str(script)] if script else []), url]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    lat = dict(re.findall(r"^\s+(50|99)%\s+([\d.]+\w+)", out, re.M))
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    socket_errors = re.search(r"Socket errors: (.*)", out)
    return {
        "requests_per_s": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),  # type: ignore[union-attr]
        "p50_ms": _ms(lat["50"]),
        "p99_ms": _ms(lat["99"]),
        "errors": int(errors.group(1)) if errors else 0,
        "socket_errors": socket_errors.group(1) if socket_errors else "none",
    }


def _ms(value: str) -> float:
    number, unit = re.match(r"([\d.]+)(\w+)", value).groups()  # type: ignore[union-attr]
    return float(number) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]


def run(stack: Stack, seconds: float) -> list[dict[str, Any]]:
    stack.start_worker()
    busy = stack.submit(**BUSY)
    wait_for(lambda: stack.job(busy["id"])["status"] == "running", 60, "the worker busy")
    script = stack.tmp / "post.lua"
    script.write_text(POST_LUA.format(body=json.dumps(JOB)))
    probe = stack.submit(**JOB)
    rows = []
    for clients in (1, 16, 64):
        post = wrk(f"{stack.url}/api/v1/jobs", clients, seconds, script)
        get = wrk(f"{stack.url}/api/v1/jobs/{probe['id']}", clients, seconds, None)
        rows.append({"clients": clients, **{f"post_{k}": v for k, v in post.items()},
                     **{f"get_{k}": v for k, v in get.items()}})  # fmt: skip
        print(rows[-1], flush=True)
    stack.http.post(f"/jobs/{busy['id']}/cancel", timeout=120)
    return rows


def first_worker(stack: Stack, seconds: float, rounds: int = 2) -> list[dict[str, Any]]:
    """Submits at 16 clients before any worker registered, then after one did: the same
    server, rounds alternating on one database, so the machine's drift hits both alike.
    The worker is a row (what the catalog reads), so nothing claims or trains meanwhile."""
    from service.catalog import register_worker
    from service.db import make_engine
    from service.models import Worker
    from workers.recipes import load_recipes

    script = stack.tmp / "post.lua"
    script.write_text(POST_LUA.format(body=json.dumps(JOB)))
    engine = make_engine(stack.database_url)
    described = [r.describe() for r in load_recipes().values()]
    rows = []
    try:
        for _ in range(rounds):
            with engine.begin() as conn:  # no worker yet (again)
                conn.execute(text("DELETE FROM worker"))
            wait_for(lambda: not stack.http.get("/workers").json(), 10, "no worker listed")
            before = wrk(f"{stack.url}/api/v1/jobs", 16, seconds, script)
            devices = [{"index": i, "kind": "cpu", "name": f"slot {i}"} for i in range(2)]
            worker = Worker(id="bench", hostname="bench", pid=1, accelerator="cpu",
                            devices=devices, recipes=described)  # fmt: skip
            register_worker(engine, worker)
            after = wrk(f"{stack.url}/api/v1/jobs", 16, seconds, script)
            row = {"no worker yet: submits/s": before["requests_per_s"],
                   "a worker registered: submits/s": after["requests_per_s"],
                   "ratio": before["requests_per_s"] / after["requests_per_s"],
                   "errors": before["errors"] + after["errors"]}  # fmt: skip
            print(row, flush=True)
            rows.append(row)
    finally:
        engine.dispose()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--api-workers", type=int, default=1, help="API server processes")
    parser.add_argument("--database", default="sqlite", help="sqlite or postgresql")
    parser.add_argument(
        "--first-worker", action="store_true", help="submits before and after a worker registers"
    )
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("needs wrk: apt-get install wrk")
    if args.first_worker:
        with tempfile.TemporaryDirectory() as tmp, running_stack(Path(tmp)) as stack:
            rows = first_worker(stack, args.seconds)
        print_table("submits before and after the first worker registers (16 clients)", rows)
        save("api-first-worker", rows)
        return
    with (
        tempfile.TemporaryDirectory() as tmp,
        database(args.database) as url,
        running_stack(Path(tmp), url, api_workers=args.api_workers) as stack,
    ):
        rows = run(stack, args.seconds)
    title = f"API on {args.database} (wrk, same 2 cores, {args.api_workers} server process(es))"
    print_table(title, rows)
    suffix = "" if args.database == "sqlite" else f"-{args.database}"
    save(f"api-{args.api_workers}-process{suffix}", rows)


if __name__ == "__main__":
    main()
