"""The sweep driver's CPU per trial: ``service.sweeps.driver.Driver`` in this process on a
new SQLite database with a registered worker row, and no training: after each
``drive()`` a loop plays the worker through the store's own functions (claim, a val/loss
point per epoch, finish; a pruned trial's stop seen at the lease renewal). Run by
``benchmarks.sweeps`` (``--only driver``).
"""

from __future__ import annotations

import math
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from service.catalog import CatalogCache, register_worker
from service.db import make_engine, read_session
from service.migrate import upgrade
from service.models import JobStatus, Worker
from service.points import MetricPoint
from service.reasons import ReasonCode
from service.settings import Settings
from service.store import (
    Fence,
    Outcome,
    claim_job,
    finish_attempt,
    load_job,
    renew_lease,
    report,
    sweep_reads,
)
from service.store import sweeps as sweep_store
from service.sweeps import search
from service.sweeps.driver import Driver
from service.sweeps.models import SweepCreate, SweepStatus
from tests.stack import RECIPES_DIR

DRIVER_EPOCHS = 3  # points per trial: the rungs of ASHA(1, 3) are epochs 1 and 3
DRIVER_PARALLEL = 4


class OptunaClock:
    """CPU of this thread inside the study's calls (Optuna's part of the driver)."""

    def __init__(self) -> None:
        self.cpu = 0.0

    def wrap(self, cls: type, name: str) -> Callable[[], None]:
        original = getattr(cls, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.thread_time()
            try:
                return original(*args, **kwargs)
            finally:
                self.cpu += time.thread_time() - start

        setattr(cls, name, timed)
        return lambda: setattr(cls, name, original)


def fake_value(lr: float, epoch: int, job_id: int) -> float:
    """A val/loss that falls with the epochs and is best near lr = 0.01."""
    return (math.log10(lr) + 2) ** 2 + 1 / epoch + (job_id % 7) / 100


def drive_sweep(tmp: Path, trials: int, method: str, asha: bool) -> dict[str, Any]:
    """A sweep of ``trials`` trials driven to its end; CPU inside ``drive()`` per trial."""
    from workers.recipes import load_recipes  # torch: only here

    url = f"sqlite:///{tmp / f'driver-{method}-{asha}.db'}"
    upgrade(url)
    settings = Settings(database_url=url, data_dir=tmp / "data", api_token=None)
    engine = make_engine(settings)
    register_worker(
        engine,
        Worker(
            id="fake", hostname="bench", pid=os.getpid(), accelerator="cpu",
            devices=[{"index": i, "kind": "cpu", "name": f"slot {i}"} for i in range(8)],
            recipes=[r.describe() for r in load_recipes(RECIPES_DIR).values()],
        ),
    )  # fmt: skip
    spec = SweepCreate.model_validate({
        "job": {"recipe": "tiny", "accelerator": "cpu", "epochs": DRIVER_EPOCHS},
        "parameters": {
            "lr": {"type": "float", "low": 1e-4, "high": 1.0, "log": True},
            "params.width": {"type": "int", "low": 1, "high": 1024},
        },
        "search": method, "seed": 0, "metric": "val/loss", "mode": "min",
        "max_trials": trials, "max_parallel": DRIVER_PARALLEL,
        "pruner": {"type": "asha", "min_resource": 1, "reduction_factor": 3} if asha else None,
    })  # fmt: skip
    sweep_id = sweep_store.create_sweep(engine, spec, "admin").id
    assert sweep_id is not None
    driver = Driver(engine, settings, CatalogCache())
    clock = OptunaClock()
    undo = [clock.wrap(search.Study, n) for n in ("__init__", "ask", "report", "end")]
    cpu, passes = 0.0, 0
    running: dict[int, tuple[Fence, int, float]] = {}  # job id -> (fence, epochs told, lr)
    cpu_at: list[float] = []  # CPU so far when each 100th trial had started
    claim: dict[str, Any] = {
        "worker_id": "fake",
        "accelerator": "cpu",
        "recipes": ["tiny"],
        "lease_s": 60.0,
    }
    wall = time.perf_counter()
    try:
        while True:
            start = time.thread_time()
            driver.drive()
            cpu += time.thread_time() - start
            passes += 1
            if not driver.held:
                break
            held = driver.held[sweep_id]
            while len(cpu_at) < held.started // 100:
                cpu_at.append(cpu)
            while len(running) < DRIVER_PARALLEL and (
                got := claim_job(engine, free_devices=DRIVER_PARALLEL - len(running), **claim)
            ):
                running[got.fence.job_id] = (got.fence, 0, load_job(engine, got.fence.job_id).lr)
            play_worker(engine, running)
        with read_session(engine) as session:
            sweep = sweep_reads.get_sweep(session, sweep_id)
            counts = sweep_reads.job_counts(session, sweep_id)
    finally:
        for restore in undo:
            restore()
        engine.dispose()
    assert sweep.status == SweepStatus.finished, sweep.reason_message
    assert sum(counts.values()) == trials, counts
    per_100 = [b - a for a, b in zip([0.0, *cpu_at], cpu_at, strict=False)]
    return {
        "search": method,
        "pruner": "asha" if asha else "none",
        "trials": trials,
        "pruned": sum(n for (_, pruned), n in counts.items() if pruned),
        "passes": passes,
        "cpu_ms_per_trial": round(1000 * cpu / trials, 2),
        "optuna_ms_per_trial": round(1000 * clock.cpu / trials, 2),
        "first_100_ms_per_trial": round(10 * per_100[0], 2) if per_100 else None,
        "last_100_ms_per_trial": round(10 * per_100[-1], 2) if per_100 else None,
        "wall_s": round(time.perf_counter() - wall, 1),
    }


def play_worker(engine: Any, running: dict[int, tuple[Fence, int, float]]) -> None:
    """One epoch of every running trial: a point each; at the last, or once stopped
    (pruned), the attempt ends as a worker would end it."""
    held = renew_lease(engine, [f for f, _, _ in running.values()], 60.0)
    for job_id, (fence, epoch, lr) in list(running.items()):
        if held[job_id].status == JobStatus.cancelling:
            finish_attempt(engine, fence, Outcome(JobStatus.cancelled, ReasonCode.cancelled, "x"))
            del running[job_id]
            continue
        epoch += 1
        value = fake_value(lr, epoch, job_id)
        point = MetricPoint("val/loss", step=10 * epoch, epoch=epoch, value=value, time=time.time())
        assert report(engine, fence, metrics=[point])
        running[job_id] = (fence, epoch, lr)
        if epoch == DRIVER_EPOCHS:
            done = Outcome(JobStatus.succeeded, ReasonCode.succeeded, "trained")
            finish_attempt(engine, fence, done)
            del running[job_id]


def driver_cpu(trials: int) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as tmp:
        return [
            drive_sweep(Path(tmp), trials, method, asha)
            for method in ("random", "tpe")
            for asha in (False, True)
        ]
