"""The CLI's tables and pages, on the API's JSON as it is: what a row and a page show."""

from __future__ import annotations

from typing import Any

import pytest

from service.cli.show import print_job, print_jobs

FAILED: dict[str, Any] = {
    "id": 13,
    "status": "failed",
    "owner": "alice",
    "name": None,
    "recipe": None,
    "entrypoint": ["python", "train.py"],
    "strategy": "ddp",
    "devices": 2,
    "nodes": 1,
    "gpu_memory_gb": None,
    "accelerator": "cpu",
    "attempt": 1,
    "max_attempts": 3,
    "epochs": 1,
    "batch_size": 64,
    "created_at": "2026-12-02T04:00:00Z",
    "reason": {
        "code": "error",
        "message": "the script rank 0 exited with 1 (the job's own error; retries_on_error "
        "is 0)\n    def f(\n           ^\nSyntaxError: expected ':'",
    },
}


def test_a_row_shows_a_reason_s_first_line_and_the_job_s_page_all_of_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    print_jobs([FAILED])
    header, row = capsys.readouterr().out.splitlines()
    assert header.split()[:3] == ["ID", "STATUS", "OWNER"]
    assert row.rstrip().endswith("(the job's own error; retries_on_error is 0)"), row
    print_job(FAILED)
    assert "SyntaxError: expected ':'" in capsys.readouterr().out


def test_a_job_s_page_names_its_devices_only_where_a_worker_holds_some(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A box's worker holds devices; Slurm places a Slurm worker's jobs itself."""
    on_a_box = {**FAILED, "status": "running", "worker_id": "box0", "assigned_devices": [0, 1]}
    print_job(on_a_box)
    assert "worker     box0 devices [0, 1]" in capsys.readouterr().out
    print_job({**on_a_box, "worker_id": "slurm", "assigned_devices": None})
    page = capsys.readouterr().out
    assert "worker     slurm\n" in page and "None" not in page, page
