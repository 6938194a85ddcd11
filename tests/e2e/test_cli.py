"""The trainyard CLI against a real server and worker."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.stack import REPO, Stack

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
