"""The database under a submit load and two busy workers: no error, no row lost."""

from __future__ import annotations

import pytest

from benchmarks import contention
from tests.stack import Stack

pytestmark = pytest.mark.slow


def test_submits_and_two_busy_workers_lose_nothing(stack: Stack) -> None:
    result = contention.run(stack, seconds=8, rate_per_s=10)
    assert result["submit_errors"] == 0
    assert result["jobs_found"] == result["submits"]
    assert result["succeeded"] > 0 and result["failed"] == 0
    assert result["missing_metric_rows"] == 0
    assert result["missing_log_lines"] == 0
    assert result["database_locked_errors"] == 0
