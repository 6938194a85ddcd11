"""Reporting overhead: a fast training loop with a metric point every step, reporting into
the real database vs into nothing, and into the database while 100 clients (another
process) watch the job's event stream on a real API server; alternated in one process.

    python -m benchmarks.reporting [--repeats 3] [--watchers 100]
"""

from __future__ import annotations

import argparse
import http.client
import multiprocessing as mp
import queue
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy import Engine

from benchmarks.common import print_table, save
from service import store
from service.db import make_engine
from service.migrate import upgrade
from service.models import JobCreate, JobStatus
from tests.stack import RECIPES_DIR, running_stack
from workers.ranks import strategies
from workers.ranks.training import InProcess, RunSpec, progress
from workers.supervisor.reporter import DbReporter

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
    strategies.run(spec, InProcess(sink))
    return EPOCHS * PARAMS["samples"] / 16 / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--watchers", type=int, default=100)
    args = parser.parse_args()
    rows = [
        measure(every, args.repeats, args.watchers)
        for every in (1, progress.TRAIN_LOSS_EVERY_STEPS)
    ]
    print_table(f"reporting (median of {args.repeats})", rows)
    save("reporting", rows)


def measure(every: int, repeats: int, watchers: int) -> dict[str, Any]:
    """Steps/s with and without reporting, a metric point every ``every`` steps."""
    progress.TRAIN_LOSS_EVERY_STEPS = every
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        url = f"sqlite:///{tmp / 'r.db'}"
        upgrade(url)
        engine = make_engine(url)
        off, on, watched, received = [], [], [], []
        with running_stack(tmp, url) as stack:
            timed_run(tmp, queue.SimpleQueue(), "warm-up")  # first-run costs out of the figures
            for i in range(repeats):
                off.append(timed_run(tmp, queue.SimpleQueue(), f"off{i}"))
                with reporting(engine) as reporter:
                    on.append(timed_run(tmp, reporter, f"on{i}"))
                with reporting(engine) as reporter:
                    collect = start_watchers(stack.url, reporter.fence.job_id, watchers)
                    watched.append(timed_run(tmp, reporter, f"watched{i}"))
                received.append(min(collect()))  # the job has finished: the streams end
    return {
        "metric_point_every_steps": every,
        "steps_per_s_off": statistics.median(off),
        "steps_per_s_on": statistics.median(on),
        "ratio": statistics.median(on) / statistics.median(off),
        f"steps_per_s_{watchers}_watchers": statistics.median(watched),
        "ratio_watched": statistics.median(watched) / statistics.median(off),
        "events_each_watcher_got_min": min(received),
    }


@contextmanager
def reporting(engine: Engine) -> Iterator[DbReporter]:
    """A new job, claimed, reported into; finished at the end (which ends its streams)."""
    store.create_job(engine, JobCreate(recipe="tiny"))
    claimed = store.claim_job(
        engine, worker_id="w", free_devices=1, accelerator="cpu", recipes=["tiny"], lease_s=600
    )
    assert claimed is not None
    fence = claimed.fence
    reporter = DbReporter(engine, fence).start()
    try:
        yield reporter
    finally:
        reporter.close()
        store.finish_attempt(engine, fence, store.Outcome(JobStatus.succeeded, "done", "done"))


def start_watchers(url: str, job_id: int, n: int) -> Callable[[], list[int]]:
    """``n`` clients in another process follow the job's events (all connected when this
    returns); the function returned waits for their streams to end and gives how many
    events each received."""
    ctx = mp.get_context("spawn")
    connected, out = ctx.Event(), ctx.Queue()
    proc = ctx.Process(target=_watch, args=(url, job_id, n, connected, out))
    proc.start()
    assert connected.wait(60), "watchers did not connect"

    def collect() -> list[int]:
        counts: list[int] = out.get(timeout=120)
        proc.join()
        return counts

    return collect


def _watch(url: str, job_id: int, n: int, connected: Any, out: Any) -> None:
    """One thread per client on the standard library's HTTP client, whose chunked reads are
    buffered C I/O: the clients share the two cores with what is measured (httpx's
    pure-Python HTTP parser took most of a core at a point every step)."""
    target = urlsplit(url)
    opened = threading.Barrier(n + 1)
    counts = [0] * n

    def follow(i: int) -> None:
        try:
            conn = http.client.HTTPConnection(target.hostname, target.port, timeout=120)
            conn.request("GET", f"/api/v1/jobs/{job_id}/events")
            response = conn.getresponse()
            assert response.status == 200, response.status
        except BaseException:
            opened.abort()  # the others and the parent stop waiting for this one
            raise
        opened.wait(timeout=60)
        tail = b"\n"  # as if a line ended before the stream; "\nevent:" may straddle reads
        while chunk := response.read1(65536):
            data = tail + chunk
            counts[i] += data.count(b"\nevent:") - tail.count(b"\nevent:")
            tail = data[-7:]
        conn.close()

    threads = [threading.Thread(target=follow, args=(i,), daemon=True) for i in range(n)]
    for thread in threads:
        thread.start()
    opened.wait(timeout=60)
    connected.set()
    for thread in threads:
        thread.join()
    out.put(counts)


if __name__ == "__main__":
    main()
