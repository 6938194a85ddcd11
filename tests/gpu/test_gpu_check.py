"""`make gpu-check` (benchmarks/gpu_check.py) on a box without a GPU: it says so and exits
0; its test selection, its verdicts and its table take the path they take on a GPU box,
with the GPU tests skipped and the benchmark on one CPU slot. On a GPU box these are
skipped: `make gpu-check` runs the real thing there."""

from __future__ import annotations

import glob
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks import gpu_check
from benchmarks.gpu_check import CHECKS, FAILED, MISSING, OTHER, PASSED, SKIPPED, Outcome
from tests.gpu.cuda import gpu_uuids
from tests.stack import REPO

no_gpu_here = pytest.mark.skipif(
    bool(glob.glob("/dev/nvidia[0-9]*") or gpu_uuids()),
    reason="a GPU is present: `make gpu-check` runs the GPU tests for real",
)


def check(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "benchmarks.gpu_check", *args]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)


@no_gpu_here
def test_without_a_gpu_it_says_so_and_exits_0() -> None:
    done = check()
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == gpu_check.NOTHING_TO_CHECK


@no_gpu_here
def test_each_check_names_gpu_tests_that_exist(tmp_path: Path) -> None:
    """The real selection, run here: every named check finds its tests (each skipped,
    saying why), and none of them would pass for run on a GPU box."""
    status, outcomes = gpu_check.run_gpu_tests(tmp_path / "gpu.xml")
    assert status == 0, outcomes
    rows = {r.check: r for r in gpu_check.check_rows(outcomes, status, rehearsal=True)}
    assert list(rows) == [*CHECKS, OTHER]
    for name in CHECKS:
        assert rows[name].result == SKIPPED and not rows[name].failing, rows[name]
        assert "needs a CUDA GPU" in rows[name].figure, rows[name]
    on_a_gpu_box = gpu_check.check_rows(outcomes, status, rehearsal=False)
    assert all(r.failing for r in on_a_gpu_box if r.check in CHECKS)


def test_a_failed_or_missing_check_fails_and_every_other_gpu_test_has_a_row() -> None:
    (invariance,) = CHECKS["strategy invariance on CUDA"]
    outcomes = [
        Outcome(invariance, "failed", 12.0, "AssertionError: 0.01 < 1e-4"),
        Outcome("tests/gpu/test_visible_devices.py::test_x[index]", "passed", 20.0),
        Outcome("tests/gpu/test_visible_devices.py::test_x[uuid]", "passed", 21.0),
        Outcome("tests/gpu/test_sharing.py::test_two_jobs_share_a_gpu", "passed", 5.0),
        Outcome("tests/gpu/test_sharing.py::test_on_two_gpus", "skipped", 0.0, "needs 2 GPUs"),
    ]
    rows = {r.check: r for r in gpu_check.check_rows(outcomes, 1, rehearsal=False)}
    failed = rows["strategy invariance on CUDA"]
    assert failed.result == FAILED and failed.failing and "1e-4" in failed.figure
    subset = rows["worker on CUDA_VISIBLE_DEVICES subset"]
    assert (subset.result, subset.figure, subset.failing) == (PASSED, "2 passed in 41 s", False)
    assert rows["bf16 on CUDA"].result == MISSING and rows["bf16 on CUDA"].failing
    other = rows[OTHER]  # a test that needs more than this box has: shown, not failing
    assert (other.result, other.figure) == (SKIPPED, "1 passed, 1 skipped: needs 2 GPUs")
    assert not other.failing
    assert "pytest" not in rows  # status 1: the failure is in its row
    assert gpu_check.check_rows([], 2, rehearsal=True)[-1].result == FAILED  # collection error
    box = gpu_check.box_row(["NVIDIA H200", "NVIDIA H200"], "580.65", rehearsal=False)
    assert box.figure.startswith("2 x NVIDIA H200; driver 580.65; torch ") and not box.failing


def test_a_pytest_run_past_its_deadline_is_ended_and_says_so(tmp_path: Path) -> None:
    status, outcomes = gpu_check.run_gpu_tests(tmp_path / "gpu.xml", timeout_s=0.2)
    assert (status, outcomes) == (-1, [])  # ended while it collected: no report
    last = gpu_check.check_rows(outcomes, status, rehearsal=True)[-1]
    assert (last.check, last.result, last.failing) == ("pytest", FAILED, True)
    assert last.figure.startswith("pytest -m gpu timed out"), last


def test_junit_outcomes_become_node_ids(tmp_path: Path) -> None:
    junit = tmp_path / "junit.xml"
    junit.write_text(
        """<testsuites><testsuite name="pytest">
        <testcase classname="tests.workers.ranks.test_strategies" name="test_bf16[cuda]"
            file="tests/workers/ranks/test_strategies.py" line="165" time="3.5" />
        <testcase classname="tests.gpu.test_x.TestBox" name="test_y"
            file="tests/gpu/test_x.py" line="9" time="1.0">
            <skipped type="pytest.skip" message="needs a CUDA GPU: NVML sees none" /></testcase>
        <testcase classname="" name="tests.gpu.test_broken" time="0.0">
            <error message="collection failure">SyntaxError</error></testcase>
        </testsuite></testsuites>"""
    )
    skip = "needs a CUDA GPU: NVML sees none"
    assert gpu_check.read_junit(junit) == [
        Outcome("tests/workers/ranks/test_strategies.py::test_bf16[cuda]", "passed", 3.5),
        Outcome("tests/gpu/test_x.py::TestBox::test_y", "skipped", 1.0, skip),
        Outcome("tests.gpu.test_broken", "error", 0.0, "collection failure"),
    ]


@no_gpu_here
def test_the_rehearsal_takes_the_whole_path_and_prints_one_table() -> None:
    """The selection, its verdicts and the table, as `make gpu-check` prints them. Without
    the benchmark (``--no-bench``): its one-device mode on CPU measured nothing a test
    could hold (this box's speed swings), and cost two minutes of the suite; its rows are
    ``bench_row``'s, tested below, and `make gpu-check` runs it on a GPU box."""
    done = check("--rehearse", "--no-bench")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    table = done.stdout[done.stdout.index("## gpu-check: rehearsal on CPU") :].splitlines()
    header = table[1]
    assert header.split() == ["check", "result", "figure"]
    at, fig = header.index("result"), header.index("figure")
    rows = {
        line[:at].strip(): (line[at:fig].strip(), line[fig:].strip()) for line in table[2:] if line
    }
    assert list(rows) == ["GPUs, driver, torch", *CHECKS, OTHER]
    assert rows["GPUs, driver, torch"] == (
        "rehearsal",
        f"no GPU used; torch {torch.__version__}, CUDA {torch.version.cuda}",
    )
    for name in CHECKS:
        assert rows[name][0] == SKIPPED, rows


SPEEDS = re.compile(r"[\d,]+ vs bare [\d,]+ samples/s: [\d.]+x \([\d.]+-[\d.]+, \d+ rounds\)")


def test_a_benchmark_row_says_both_speeds_and_their_ratio() -> None:
    measured = {
        "strategy": "ddp(1) on cuda",
        "service_cpu_pct_of_training": 0.41,
        "bare_batched_samples_per_s": 251234.7,
        "trainyard_samples_per_s": 249876.1,
        "ratio_like_for_like": 0.99459,
        "like_for_like_95pct": [0.981, 1.007],
        "rounds": 14,
    }
    row = gpu_check.bench_row(measured)
    assert (row.check, row.result, row.failing) == ("overhead ddp(1) on cuda", "measured", False)
    assert row.figure == (
        "249,876 vs bare 251,235 samples/s: 0.995x (0.981-1.007, 14 rounds); service CPU 0.41%"
    )
    assert SPEEDS.match(row.figure)
