"""The trainyard CLI against a real server and worker."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.stack import REPO, Stack, free_port, stack_env, wait_for

pytestmark = pytest.mark.slow


def cli(stack: Stack, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "service.cli", *args, "--url", stack.url],
        env=stack.env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_submit_follow_exit_code_says_how_the_job_ended(stack: Stack, tmp_path: Path) -> None:
    stack.start_worker()
    ok = cli(stack, "submit", "--recipe", "tiny", "--epochs", "2", "-p", "width=4", "--follow")
    assert ok.returncode == 0, ok.stderr
    job_id = int(ok.stdout.strip())
    assert stack.job(job_id)["status"] == "succeeded"
    assert "succeeded" in ok.stderr

    spec = tmp_path / "job.yaml"
    spec.write_text("recipe: tiny\nmax_attempts: 1\nparams:\n  fail: true\n")
    bad = cli(stack, "submit", str(spec), "--follow")
    assert bad.returncode == 1
    assert stack.job(int(bad.stdout.strip()))["status"] == "failed"

    shown = cli(stack, "status", str(job_id))
    assert shown.returncode == 0 and '"status": "succeeded"' in shown.stdout
    listed = cli(stack, "ls")
    assert listed.returncode == 0 and len(listed.stdout.strip().splitlines()) == 2
    logs = cli(stack, "logs", str(job_id))
    assert logs.returncode == 0 and "attempt 1 started" in logs.stdout
    again = cli(stack, "cancel", str(job_id))
    assert again.returncode == 1 and "409" in again.stderr


def test_cli_reports_a_bad_spec_with_the_field(stack: Stack) -> None:
    stack.start_worker()
    r = cli(stack, "submit", "--recipe", "tiny", "--epochs", "0")
    assert r.returncode == 1 and "epochs" in r.stderr


def test_up_stops_its_worker_when_it_is_stopped(tmp_path: Path) -> None:
    port = free_port()
    env = stack_env(tmp_path, f"sqlite:///{tmp_path / 'trainyard.db'}", port)
    api = httpx.Client(base_url=f"http://127.0.0.1:{port}/api/v1", timeout=5)
    with open(tmp_path / "up.log", "wb") as log:
        up = subprocess.Popen(
            [sys.executable, "-m", "service.cli", "up"],
            env=env,
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    pid = None
    try:

        def worker_pid() -> int | None:
            try:
                workers = api.get("/workers").json()
            except httpx.HTTPError:
                return None
            return next((w["pid"] for w in workers if w["alive"]), None)

        pid = wait_for(worker_pid, 60, "the worker beside the API to register")
        up.send_signal(signal.SIGTERM)  # what systemd or `kill` sends
        assert up.wait(timeout=60) == 128 + signal.SIGTERM, (tmp_path / "up.log").read_text()
        # Its worker went with it (it used to run on, orphaned, after uvicorn's shutdown).
        assert not Path(f"/proc/{pid}").exists(), (tmp_path / "up.log").read_text()
    finally:
        if up.poll() is None:
            up.kill()
        if pid is not None and Path(f"/proc/{pid}").exists():  # orphaned: do not leak it
            os.kill(pid, signal.SIGKILL)
        api.close()
