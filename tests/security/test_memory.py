"""Careless neighbours: a job that asks for more memory than its share
of the box must fail alone, and fail for good.

A built-in recipe's ``features`` x ``train_samples`` can ask for terabytes. On a CPU box
each job now has a budget (its slots' part of ``JOB_MEMORY_FRACTION`` of the box's
memory): past it, its allocation is refused, the job ends ``failed`` with reason
``out_of_memory`` on its first attempt (another attempt would run out again), and the
worker and the API live on. What the recipe can tell is too big is refused at submit
(422 naming the fields and the figure), before any worker spends memory on it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from service.catalog import register_worker
from service.models import Accelerator, JobStatus, Worker
from service.reasons import ReasonCode
from tests.scripts import put_package
from tests.stack import RECIPES_DIR, running_stack, wait_for
from workers.outcome import RunnerReport, decide
from workers.recipes import load_recipes
from workers.supervisor.devices import Box
from workers.supervisor.memory import MIN_PROCESS_BYTES, box_memory_bytes

GIB = 2**30


def add_worker(engine: Engine, slots: int, slot_mb: int | None) -> None:
    """A worker row offering the built-in recipes, its slots of ``slot_mb`` each (None:
    a worker that does not say, as one from before memory budgets)."""
    memory = {} if slot_mb is None else {"memory_mb": slot_mb}
    register_worker(
        engine,
        Worker(
            id="w1",
            hostname="test",
            pid=1,
            accelerator="cpu",
            devices=[{"index": i, "kind": "cpu", **memory} for i in range(slots)],
            recipes=[r.describe() for r in load_recipes(RECIPES_DIR).values()],
        ),
    )


def huge(**spec: Any) -> dict[str, Any]:
    """A recipe job whose data set alone is 65536 features x 10M samples x 4 bytes."""
    params = {"features": 65536, "train_samples": 10_000_000}
    return {"recipe": "mlp-regression", "devices": 1, "params": params, **spec}


def test_submit_refuses_what_no_worker_has_memory_for(client: TestClient, engine: Engine) -> None:
    add_worker(engine, slots=2, slot_mb=8192)  # 16 GiB for a job on both slots
    r = client.post("/api/v1/jobs", json=huge())
    assert r.status_code == 422, r.text
    [error] = r.json()["detail"]
    assert error["loc"] == ["body", "params"]
    for named in ("features", "train_samples", "val_samples", "2.4 TiB", "8.0 GiB"):
        assert named in error["msg"], error["msg"]
    assert client.get("/api/v1/jobs").json()["total"] == 0  # nothing was queued
    # Two slots' worth for a single process of two devices (ddp splits it by rank).
    r = client.post("/api/v1/jobs", json=huge(strategy="ddp", devices=2, batch_size=64))
    assert r.status_code == 422 and "8.0 GiB" in r.json()["detail"][0]["msg"]
    # A job the memory holds is accepted.
    small = {"features": 64, "train_samples": 10_000}
    r = client.post("/api/v1/jobs", json=huge(params=small))
    assert r.status_code == 201, r.text


def test_submit_does_not_guess_for_workers_that_do_not_say(
    client: TestClient, engine: Engine
) -> None:
    add_worker(engine, slots=2, slot_mb=None)
    assert client.post("/api/v1/jobs", json=huge()).status_code == 201


def test_a_jobs_part_is_its_slots_part_shared_by_its_processes() -> None:
    slots = [{"index": i, "kind": "cpu", "memory_mb": 4096} for i in range(4)]
    cpu = Box(Accelerator.cpu, slots)
    assert cpu.memory_limit([0], processes=1) == 4 * GIB
    assert cpu.memory_limit([1, 2, 3], processes=1) == 12 * GIB  # single or dp
    assert cpu.memory_limit([1, 2, 3], processes=3) == 4 * GIB  # ddp: each rank its part
    tiny = Box(Accelerator.cpu, [{"index": 0, "kind": "cpu", "memory_mb": 100}])
    assert tiny.memory_limit([0], processes=1) == MIN_PROCESS_BYTES  # torch needs that much
    gpus = [{"index": 0, "kind": "cuda", "memory_mb": 81559, "physical_id": "GPU-a"}]
    assert Box(Accelerator.cuda, gpus).memory_limit([0], processes=1) is None


def test_out_of_memory_is_final() -> None:
    error = {"type": "builtins.RuntimeError", "message": "can't allocate memory"}
    report = RunnerReport(ok=False, error={**error, "code": "out_of_memory", "retryable": False})
    outcome = decide(None, report, 1, timeout_s=None, stall_timeout_s=60, worker_id="w")
    assert outcome.status == JobStatus.failed and outcome.reason_code == ReasonCode.out_of_memory
    assert not outcome.retryable


@pytest.mark.slow
def test_a_job_past_its_memory_fails_alone_and_for_good(tmp_path: Path) -> None:
    """A real worker whose slots hold 1 GiB each; the job's data set is ~0.6 GiB (so the
    submit lets it through) but building it takes three times as much."""
    fraction = 2 * GIB / box_memory_bytes()  # two slots of 1 GiB
    with running_stack(tmp_path) as stack:
        worker = stack.start_worker(job_memory_fraction=fraction)
        [offered] = [w for w in stack.http.get("/workers").json() if w["id"] == "e2e"]
        # 1023 or 1024: the fraction went through text
        assert all(d["memory_mb"] in (1023, 1024) for d in offered["devices"]), offered
        features = 1024
        samples = int(0.6 * GIB / 4 / features)
        params = {"features": features, "train_samples": samples, "val_samples": 1024}
        single = stack.submit(recipe="mlp-classifier", devices=1, epochs=1, params=params)
        # ddp: each of its two ranks builds the data set in its own slot's part
        ddp = stack.submit(recipe="mlp-classifier", devices=2, epochs=1, params=params)
        for job in (single, ddp):
            done = stack.wait_status(job["id"], {"succeeded", "failed"})
            assert done["status"] == "failed", done
            assert done["reason"]["code"] == "out_of_memory", done["reason"]
            assert done["attempt"] == 1  # not retried: the same spec would run out again
            assert "can't allocate memory" in done["error"]["message"]
        # A script job runs under the same limit; its traceback's last line says it ran out.
        code = tmp_path / "greedy"
        code.mkdir()
        (code / "greedy.py").write_text(
            "import torch\nprint('asking for 3 GiB', flush=True)\n"
            "torch.ones(3 * 2**30, dtype=torch.uint8)\n"
        )
        script = stack.submit(
            code=put_package(stack.http, code, tmp_path),
            entrypoint=["python", "greedy.py"],
            accelerator="cpu",
        )
        done = stack.wait_status(script["id"], {"succeeded", "failed"})
        assert done["status"] == "failed", done
        assert done["reason"]["code"] == "out_of_memory", done["reason"]
        assert done["attempt"] == 1
        assert "can't allocate memory" in done["error"]["traceback"][-1]
        # The worker lives on and runs the next job; the API answers.
        assert worker.poll() is None
        nxt = stack.submit(recipe="mlp-classifier", devices=1, epochs=1)
        assert stack.wait_status(nxt["id"], {"succeeded", "failed"})["status"] == "succeeded"
        wait_for(lambda: stack.http.get("/workers").json()[0]["alive"], 10, "the worker alive")


def test_an_estimate_past_any_float_is_still_said() -> None:
    """A custom recipe's unbounded params can make an integer no float holds: the 422
    must still be written (it was an OverflowError, a 500)."""
    from service.recipe_memory import size

    assert size(10**400) == "more than 2^100 bytes"
    assert size(3 * 2**40) == "3.0 TiB"
