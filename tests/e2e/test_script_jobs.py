"""Script jobs end to end: the examples uploaded, run by a real worker under each strategy
(one process, the script's own mp.spawn, torchrun), their metrics, logs and artifacts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.scripts import EXAMPLES, digits_file, put_blob, put_package
from tests.stack import Stack

pytestmark = pytest.mark.slow


def submit_example(stack: Stack, tmp: Path, command: list[str], **spec: Any) -> dict[str, Any]:
    code = put_package(stack.http, EXAMPLES, tmp)
    data = put_blob(stack.http, digits_file(tmp))
    return stack.submit(
        code=code, entrypoint=command, data={"digits.npz": data}, accelerator="cpu", **spec
    )


def texts(stack: Stack, job_id: int) -> list[str]:
    return [x["text"] for x in stack.http.get(f"/jobs/{job_id}/logs").json()]


def artifacts(stack: Stack, job_id: int) -> set[str]:
    return {a["name"] for a in stack.http.get(f"/jobs/{job_id}/artifacts").json()}


def test_the_dataparallel_tutorial_runs_as_one_process(stack: Stack, tmp_path: Path) -> None:
    stack.start_worker()
    job = submit_example(
        stack, tmp_path, ["python", "dataparallel/train.py", "--epochs", "2"], strategy="single"
    )
    done = stack.wait_status(job["id"], {"succeeded", "failed"})
    assert done["status"] == "succeeded" and done["attempt"] == 1, done
    assert done["entrypoint"][1] == "dataparallel/train.py"
    assert done["result"]["val/accuracy"] > 0.5  # it learned: real digits, a real model
    accuracy = stack.http.get(f"/jobs/{job['id']}/metrics", params={"name": "val/accuracy"})
    assert [m["epoch"] for m in accuracy.json()] == [1, 2]
    assert done["progress"]["step"] == done["progress"]["total_steps"] == 30
    assert any(t.startswith("Outside: input size (100, 1, 8, 8)") for t in texts(stack, job["id"]))
    assert "output/model.pt" in artifacts(stack, job["id"])


def test_the_mp_spawn_ddp_tutorial_starts_its_own_ranks(stack: Stack, tmp_path: Path) -> None:
    stack.start_worker()
    job = submit_example(
        stack,
        tmp_path,
        ["python", "ddp_spawn/train.py", "--epochs", "2"],
        strategy="dp",
        devices=2,
    )
    done = stack.wait_status(job["id"], {"succeeded", "failed"})
    assert done["status"] == "succeeded" and done["attempt"] == 1, done
    lines = texts(stack, job["id"])
    for rank in (0, 1):  # two ranks, found through MASTER_ADDR/MASTER_PORT
        # (ranks print to one pipe at once: a line may hold both, as a terminal shows it)
        assert any(f"[GPU{rank}] Epoch 1 | Batchsize: 32" in t for t in lines), lines
    assert "output/model.pt" in artifacts(stack, job["id"])


def test_a_torchrun_script_runs_unchanged_under_ddp(stack: Stack, tmp_path: Path) -> None:
    stack.start_worker()
    job = submit_example(
        stack,
        tmp_path,
        ["python", "torchrun_resume/train.py", "--epochs", "2"],
        strategy="ddp",
        devices=2,
    )
    done = stack.wait_status(job["id"], {"succeeded", "failed"})
    assert done["status"] == "succeeded" and done["attempt"] == 1, done
    lines = texts(stack, job["id"])
    assert any(t.startswith("[rank 0] Epoch 2 | Training snapshot saved") for t in lines), lines
    assert {"output/model.pt", "checkpoints/snapshot.pt"} <= artifacts(stack, job["id"])
    assert done["progress"]["epoch"] == 2
