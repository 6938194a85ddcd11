"""The Python client's cost per call against a bare httpx request, side by side.

    python -m benchmarks.client [--calls 100] [--rounds 15] [--jobs 60]

One process, one real server (``tests.stack.running_stack``, SQLite, no worker: the jobs
stay queued and nothing else moves). Each side holds one ``httpx.Client`` (one kept-alive
connection): the client's ``Client`` and a bare ``httpx.Client`` at the same base URL.
Rounds alternate which side goes first; each side makes ``--calls`` calls in a row, and
its time per call is the round's time over the calls (wall, and this process's CPU: the
server's work is the same for both sides, so the CPU difference is the client's own).
Two operations:

- one job: ``client.job(id)`` against ``http.get("/jobs/{id}").json()``;
- a page of 50: the first 50 of ``client.jobs(page_size=50)`` (one request: the next page
  is read only when a 51st job is asked for) against ``GET /jobs?limit=50&offset=0`` and
  ``.json()``.

Also timed, without the server, on the answers the bare side read: what the client adds
to a body already received (validating its bytes into ``Job`` handles, bound to the client).
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from benchmarks.common import print_table, save
from tests.stack import running_stack
from trainyard import Client
from trainyard import models as m
from trainyard.handles import Job

PAGE = 50
GOAL = 1.1  # the client's time per call over the bare request's, at most


def per_call_ms(call: Callable[[], object], calls: int) -> tuple[float, float]:
    """(wall, this thread's CPU) per call, in ms."""
    start, cpu = time.perf_counter(), time.thread_time()
    for _ in range(calls):
        call()
    return (
        (time.perf_counter() - start) * 1000 / calls,
        (time.thread_time() - cpu) * 1000 / calls,
    )


def side_by_side(
    client_call: Callable[[], object], bare_call: Callable[[], object], calls: int, rounds: int
) -> dict[str, Any]:
    """Per-call medians over ``rounds``, the per-round ratio client/bare (wall), and the
    CPU this process spent per call (on a loaded machine the steadier figure)."""
    for call in (client_call, bare_call):  # warm: connections open, code paths taken
        per_call_ms(call, max(1, calls // 10))
    client: list[tuple[float, float]] = []
    bare: list[tuple[float, float]] = []
    for r in range(rounds):
        order = [(client_call, client), (bare_call, bare)]
        for call, times in order if r % 2 == 0 else reversed(order):
            times.append(per_call_ms(call, calls))
    ratios = sorted(c[0] / b[0] for c, b in zip(client, bare, strict=True))
    client_cpu = statistics.median(c[1] for c in client) * 1000
    bare_cpu = statistics.median(b[1] for b in bare) * 1000
    return {
        "client_ms": statistics.median(c[0] for c in client),
        "bare_ms": statistics.median(b[0] for b in bare),
        "ratio": statistics.median(ratios),
        "ratio_min": ratios[0],
        "ratio_max": ratios[-1],
        "client_cpu_us": client_cpu,
        "bare_cpu_us": bare_cpu,
        "added_cpu_us": client_cpu - bare_cpu,
    }


def in_process_us(call: Callable[[], object], calls: int) -> float:
    """Median over 5 rounds of a call's CPU time, in microseconds."""
    return statistics.median(per_call_ms(call, calls)[1] for _ in range(5)) * 1000


def parse_costs(text: bytes, page: bool, client: Client, calls: int) -> dict[str, float]:
    """Without the server, CPU per answer: the bare side's parse (``json.loads``), and the
    client's (the bytes validated straight into ``Job`` handles, as ``Client`` reads an
    answer, each then bound to the client)."""
    model: Any = m.Page[Job] if page else Job

    def read() -> list[Job]:
        answer = model.model_validate_json(text)
        return [client._job(j) for j in (answer.items if page else [answer])]

    return {
        "json.loads_us": in_process_us(lambda: json.loads(text), calls),
        "validate_us": in_process_us(lambda: model.model_validate_json(text), calls),
        "validate+bind_us": in_process_us(read, calls),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=100, help="calls per side per round")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--jobs", type=int, default=60, help="jobs submitted (>= 50)")
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp, running_stack(Path(tmp)) as stack:
        for i in range(max(args.jobs, PAGE)):
            job = stack.submit(recipe="tiny", epochs=1, params={"samples": 64}, name=f"bench-{i}")
        job_id = job["id"]
        page_params = {"limit": PAGE, "offset": 0}
        with (
            Client(stack.url) as client,
            httpx.Client(base_url=stack.url + "/api/v1", timeout=30) as bare,
        ):
            one_job = side_by_side(
                lambda: client.job(job_id),
                lambda: bare.get(f"/jobs/{job_id}").json(),
                args.calls,
                args.rounds,
            )
            page = side_by_side(
                lambda: list(itertools.islice(client.jobs(page_size=PAGE), PAGE)),
                lambda: bare.get("/jobs", params=page_params).json(),
                max(1, args.calls // 4),
                args.rounds,
            )
            one_text = bare.get(f"/jobs/{job_id}").content
            page_text = bare.get("/jobs", params=page_params).content
        assert len(json.loads(page_text)["items"]) == PAGE
        rows.append({"call": "GET /jobs/{id}", **one_job})
        rows.append({"call": f"GET /jobs?limit={PAGE}", **page})

    in_process = [
        {"answer": "one job", **parse_costs(one_text, False, client, 2000)},
        {"answer": f"page of {PAGE}", **parse_costs(page_text, True, client, 200)},
    ]
    title = f"client against bare httpx, per call ({args.rounds} rounds of {args.calls})"
    print_table(title, rows)
    print_table("parsing an answer already received (no server), CPU per call", in_process)
    missed = [r["call"] for r in rows if r["ratio"] > GOAL]
    print(f"\ngoal client/bare <= {GOAL}x: " + (f"missed by {missed}" if missed else "met"))
    save("client", {"calls": args.calls, "rounds": args.rounds, "rows": rows,
                    "in_process": in_process})  # fmt: skip


if __name__ == "__main__":
    main()
