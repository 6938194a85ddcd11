"""Script jobs end to end: the examples uploaded, run by a real worker under each strategy
(one process, the script's own mp.spawn, the elastic launch torchrun uses), their
metrics, logs and artifacts."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.e2e.conftest import one_database
from tests.e2e.test_chaos import job_weights
from tests.scripts import EXAMPLES, digits_file, put_blob, put_package
from tests.stack import Stack, wait_for
from tests.workers.ranks.test_strategies import relative_difference

# The examples run on both databases; what happens to a script's processes and files
# (a kill, SIGTERM, a cancel, a fetch) does not depend on the database, and each runs on
# one (the store's part of each is tested on both, at the service level and with recipes),
# except a killed worker's recovery, which runs on both.
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


def test_every_example_runs_uploaded_to_succeeded(stack: Stack, tmp_path: Path) -> None:
    """Upload, submit, running, metrics, artifacts, succeeded: the DataParallel tutorial
    (one process), the mp.spawn DDP tutorial (one process holding two devices, its own
    ranks), the torchrun script (a rank per device, launched as torchrun launches it),
    and the recipe package (Trainyard's loop: single and ddp end with the same weights;
    params checked at claim). All queued at once on one worker with two CPU slots."""
    stack.start_worker()
    code = put_package(stack.http, EXAMPLES, tmp_path)
    digits = {"digits.npz": put_blob(stack.http, digits_file(tmp_path))}
    script = {"code": code, "data": digits, "accelerator": "cpu"}
    dataparallel = stack.submit(
        **script, entrypoint=["python", "dataparallel/train.py", "--epochs", "2"], strategy="single"
    )
    spawn = stack.submit(
        **script,
        entrypoint=["python", "ddp_spawn/train.py", "--epochs", "2"],
        strategy="dp",
        devices=2,
    )
    torchrun = stack.submit(
        **script,
        entrypoint=["python", "torchrun_resume/train.py", "--epochs", "2"],
        strategy="ddp",
        devices=2,
    )
    recipe = {
        "recipe": "digits-mlp",
        "code": put_package(stack.http, EXAMPLES / "recipe_package", tmp_path),
        "data": digits,
        "accelerator": "cpu",
        "epochs": 2,
        "batch_size": 64,
        "params": {"hidden": 32},
    }
    single = stack.submit(**recipe, strategy="single")
    ddp = stack.submit(**recipe, strategy="ddp", devices=2)
    bad = stack.submit(**{**recipe, "params": {"hidden": 0}})
    missing = stack.submit(**{**recipe, "recipe": "no-such-recipe"})
    done = {
        job["id"]: stack.wait_status(job["id"], {"succeeded", "failed"}, timeout_s=240)
        for job in (dataparallel, spawn, torchrun, single, ddp, bad, missing)
    }
    for job in (dataparallel, spawn, torchrun, single, ddp):
        assert done[job["id"]]["status"] == "succeeded" and done[job["id"]]["attempt"] == 1

    # the DataParallel tutorial: it learned, and reported through trainyard_job
    job = done[dataparallel["id"]]
    assert job["entrypoint"][1] == "dataparallel/train.py"
    assert job["result"]["val/accuracy"] > 0.5  # real digits, a real model
    accuracy = stack.http.get(f"/jobs/{job['id']}/metrics", params={"name": "val/accuracy"})
    assert [m["epoch"] for m in accuracy.json()] == [1, 2]
    assert job["progress"]["step"] == job["progress"]["total_steps"] == 30
    lines = texts(stack, job["id"])
    assert any(t.startswith("Outside: input size (100, 1, 8, 8)") for t in lines), lines
    assert "output/model.pt" in artifacts(stack, job["id"])

    # the mp.spawn tutorial: two ranks, found through MASTER_ADDR/MASTER_PORT (they print
    # to one pipe at once: a line may hold both, as a terminal would show it)
    lines = texts(stack, spawn["id"])
    for rank in (0, 1):
        assert any(f"[GPU{rank}] Epoch 1 | Batchsize: 32" in t for t in lines), lines
    assert "output/model.pt" in artifacts(stack, spawn["id"])

    # the torchrun script: its ranks' lines behind [rank N], its snapshot kept
    lines = texts(stack, torchrun["id"])
    assert any(t.startswith("[rank 0] Epoch 2 | Training snapshot saved") for t in lines), lines
    assert {"output/model.pt", "checkpoints/snapshot.pt"} <= artifacts(stack, torchrun["id"])
    assert done[torchrun["id"]]["progress"]["epoch"] == 2

    # the recipe package
    for job in (single, ddp):
        assert done[job["id"]]["result"]["val/accuracy"] > 0.5
    assert (
        relative_difference(job_weights(stack, single["id"]), job_weights(stack, ddp["id"])) < 1e-4
    )
    assert done[bad["id"]]["reason"]["code"] == "bad_params" and done[bad["id"]]["attempt"] == 1
    assert done[missing["id"]]["reason"]["code"] == "unknown_recipe"
    reason = done[missing["id"]]["reason"]["message"]  # a sentence, no exception type
    assert reason.startswith("the job's package defines no recipe"), reason
    assert "defines: digits-mlp" in reason


def script_pids(stack: Stack, job_id: int, attempt: int) -> list[int]:
    """Processes that run an attempt of the job's script, found by their environment. The
    job's output folder names this test's stack: job ids repeat across the tests that run
    beside this one, each with its own database."""
    output = stack.tmp / "data" / "jobs" / str(job_id) / "output"
    marks = (
        f"TRAINYARD_OUTPUT_DIR={output.resolve()}".encode(),
        f"TRAINYARD_ATTEMPT={attempt}".encode(),
    )
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if all(mark in env for mark in marks):
            pids.append(int(entry.name))
    return pids


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def by_hand(tmp: Path, command: list[str]) -> dict[str, torch.Tensor]:
    """The example run as its tutorial says (torchrun, no Trainyard): its final weights."""
    out = tmp / "by-hand"
    out.mkdir()
    env = {**os.environ, "TRAINYARD_CHECKPOINT_DIR": str(out), "TRAINYARD_OUTPUT_DIR": str(out)}
    subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         *command, "--data", str(digits_file(tmp))],
        cwd=EXAMPLES, env=env, check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    return torch.load(out / "model.pt")  # type: ignore[no-any-return]


# On both databases: the restarted worker's recovery (killing the old attempt's tree,
# requeueing it) goes through the store, and on PostgreSQL the stopped runner's own
# database connection stays open until that kill.
def test_a_worker_killed_mid_script_resumes_from_the_checkpoint_dir(
    stack: Stack, tmp_path: Path
) -> None:
    """kill -9 of the worker: its restart kills the old attempt's whole tree (the runner
    that launched the ranks, and the ranks through their parent-death signal, stopped
    processes included), and the retry finds the snapshot the script left in
    $TRAINYARD_CHECKPOINT_DIR: the same weights as the script run by hand under torchrun,
    never stopped."""
    command = ["torchrun_resume/train.py", "--epochs", "6"]
    worker = stack.start_worker(lease_s=60)  # recovery by restart, not by lease expiry
    job = submit_example(
        stack, tmp_path, ["python", *command, "--step-delay", "0.05"], strategy="ddp", devices=2
    )
    wait_for(lambda: (stack.job(job["id"])["progress"] or {}).get("epoch", 0) >= 2, 90, "epoch 2")
    first = script_pids(stack, job["id"], 1)
    assert len(first) == 2  # the ranks (the runner, their launcher, was started without it)
    # The whole box stops at once: the worker dies, the attempt freezes where it is (left
    # running, it could finish before the restarted worker kills it, and resume nothing).
    runner = stack.runner_pgid(job["id"])
    os.killpg(runner, signal.SIGSTOP)
    for pid in first:
        os.kill(pid, signal.SIGSTOP)
    worker.kill()
    worker.wait()
    stack.start_worker()
    done = stack.wait_status(job["id"], {"succeeded", "failed"})
    assert done["status"] == "succeeded" and done["attempt"] == 2, done
    assert not [pid for pid in first if alive(pid)]  # nothing of attempt 1 survived
    lines = texts(stack, job["id"])
    resumed = [t for t in lines if "Resuming training from snapshot at Epoch" in t]
    assert resumed and int(resumed[0].split()[-1]) < 6, lines  # in the middle, not at the end
    got = torch.load(stack.tmp / "data" / "jobs" / str(job["id"]) / "output" / "model.pt")
    want = by_hand(tmp_path, command)
    assert got.keys() == want.keys()
    for name in want:
        assert torch.equal(got[name], want[name]), name


@one_database("postgresql")
def test_sigterm_means_checkpoint_and_stop_and_spends_no_attempt(
    stack: Stack, tmp_path: Path
) -> None:
    """The contract for script authors: the worker's SIGTERM to the attempt's process
    group (here the worker stopping; a preemption sends the same) reaches the ranks
    through the launch; a script that saves and exits in the grace period goes back to
    the queue with its attempt unspent, and resumes."""
    worker = stack.start_worker(kill_grace_s=30)
    job = submit_example(
        stack,
        tmp_path,
        ["python", "torchrun_resume/train.py", "--epochs", "5", "--step-delay", "0.05"],
        strategy="ddp",
        devices=2,
        max_attempts=1,  # a spent attempt would fail the job
    )
    wait_for(lambda: (stack.job(job["id"])["progress"] or {}).get("epoch", 0) >= 1, 90, "epoch 1")
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=60) == 0
    back = stack.job(job["id"])
    assert (back["status"], back["reason"]["code"]) == ("queued", "worker_shutdown"), back
    stack.start_worker(kill_grace_s=30)
    done = stack.wait_status(job["id"], {"succeeded", "failed"})
    assert done["status"] == "succeeded" and done["attempt"] == 1, done
    lines = texts(stack, job["id"])
    assert any("Resuming training from snapshot" in t for t in lines), lines


def test_a_sigterm_its_worker_did_not_send_spends_an_attempt(stack: Stack, tmp_path: Path) -> None:
    """A SIGTERM from elsewhere (the job's own code may send one to its group): the script
    saves and stops as it would for its worker, and is retried from there, but an
    attempt is spent; handed back free, a job signalling itself ran again at once, for
    ever."""
    stack.start_worker(kill_grace_s=30)
    job = submit_example(
        stack,
        tmp_path,
        ["python", "torchrun_resume/train.py", "--epochs", "5", "--step-delay", "0.05"],
        strategy="ddp",
        devices=2,
        max_attempts=2,
    )
    wait_for(lambda: (stack.job(job["id"])["progress"] or {}).get("epoch", 0) >= 1, 90, "epoch 1")
    os.killpg(stack.runner_pgid(job["id"]), signal.SIGTERM)
    done = stack.wait_status(job["id"], {"succeeded", "failed"})
    assert done["status"] == "succeeded" and done["attempt"] == 2, done
    lines = texts(stack, job["id"])
    assert any("stopped by a SIGTERM its worker did not send" in t for t in lines), lines
    assert any("Resuming training from snapshot" in t for t in lines), lines


@one_database("sqlite")
def test_a_script_that_cannot_run_fails_once_with_its_cause_in_the_reason(
    stack: Stack, tmp_path: Path
) -> None:
    """A SyntaxError fails the same way every attempt: one attempt, not max_attempts, and
    the reason (what follow, status and the dashboard show) ends with Python's words."""
    stack.start_worker()
    package = tmp_path / "broken"
    package.mkdir()
    (package / "train.py").write_text("import sys\n\ndef main()\n    pass\n")
    code = put_package(stack.http, package, tmp_path)
    job = stack.submit(
        code=code, entrypoint=["python", "train.py"], accelerator="cpu", max_attempts=3
    )
    done = stack.wait_status(job["id"], {"succeeded", "failed"})
    assert (done["status"], done["attempt"], done["reason"]["code"]) == ("failed", 1, "error")
    first, *rest = done["reason"]["message"].splitlines()
    assert first == "the script exited with 1 (the job's own error; retries_on_error is 0)"
    assert rest[-1] == "SyntaxError: expected ':'", rest
    assert done["error"]["own_failures"] == 1
    # the log says how it ended in one line: the stderr lines are in the log already
    ended = [t for t in texts(stack, job["id"]) if "attempt 1 ended" in t]
    assert [t.split("] ", 1)[-1] for t in ended] == ["attempt 1 ended: the script exited with 1"]


@one_database("postgresql")  # several boxes share PostgreSQL
def test_a_worker_on_another_box_fetches_blobs_by_digest(stack: Stack, tmp_path: Path) -> None:
    """No shared filesystem: a worker whose disk lacks the API's blob store fetches each
    blob from the API, verifies its SHA-256 and keeps it; bytes that do not match are
    never used."""
    box = tmp_path / "other-box"
    stack.start_worker(env={"TRAINYARD_DATA_DIR": str(box)})
    code = put_package(stack.http, EXAMPLES, tmp_path)
    digits = put_blob(stack.http, digits_file(tmp_path))
    command = ["python", "dataparallel/train.py", "--epochs", "1"]
    spec = {"code": code, "entrypoint": command, "accelerator": "cpu", "max_attempts": 1}
    job = stack.submit(**spec, data={"digits.npz": digits})
    done = stack.wait_status(job["id"], {"succeeded", "failed"})
    assert done["status"] == "succeeded", done
    for digest in (code, digits):
        assert (box / "cache" / "blobs" / digest.removeprefix("sha256:")).is_file()
    assert (box / "jobs" / str(job["id"]) / "output" / "model.pt").is_file()

    # the API's copy of a new blob goes bad on its disk: the fetch sees it
    other = tmp_path / "other.npz"
    other.write_bytes(digits_file(tmp_path).read_bytes() + b"\0")
    bad = put_blob(stack.http, other)
    stored = stack.tmp / "data" / "blobs" / "sha256" / bad.removeprefix("sha256:")
    stored.chmod(0o644)
    stored.write_bytes(b"\1" * stored.stat().st_size)
    job = stack.submit(**spec, data={"digits.npz": bad})
    failed = stack.wait_status(job["id"], {"succeeded", "failed"})
    assert failed["status"] == "failed" and "arrived with digest" in failed["reason"]["message"]
    assert not (box / "cache" / "blobs" / bad.removeprefix("sha256:")).exists()


@one_database("sqlite")
def test_cancel_ends_every_process_of_a_script(stack: Stack, tmp_path: Path) -> None:
    """The elastic launch starts each rank in a session of its own: a cancel still ends
    them all."""
    stack.start_worker(kill_grace_s=5)
    job = submit_example(
        stack,
        tmp_path,
        ["python", "torchrun_resume/train.py", "--epochs", "50", "--step-delay", "0.05"],
        strategy="ddp",
        devices=2,
    )
    wait_for(lambda: (stack.job(job["id"])["progress"] or {}).get("epoch", 0) >= 1, 90, "epoch 1")
    pids = script_pids(stack, job["id"], 1)
    assert len(pids) == 2
    assert stack.http.post(f"/jobs/{job['id']}/cancel").status_code == 202
    done = stack.wait_status(job["id"], {"cancelled"}, timeout_s=30)
    assert done["reason"]["code"] == "cancelled"
    wait_for(lambda: not [p for p in pids if alive(p)], 10, "every process to end")
