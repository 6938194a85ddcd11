"""`make gpu-check`: what a new GPU box must pass, in one table (check, result, figure).

    python -m benchmarks.gpu_check [--seconds 15] [--no-bench]
    python -m benchmarks.gpu_check --rehearse [--seconds 2 --samples 8192]   # the same, on CPU

On a box with a CUDA GPU: the ``gpu``-marked tests (single, dp and ddp jobs on CUDA with
NCCL, the strategy-invariance and bf16 tests on CUDA, a cancel with NVML's release check,
a worker confined by ``CUDA_VISIBLE_DEVICES``, and any other ``gpu`` test), in one pytest
run, then ``benchmarks.overhead``'s one-GPU mode (single, dp and ddp: samples/s against
the bare script): about 5 minutes on one GPU, by estimate (not yet run on one). Exit 1
when a check failed, was skipped or matched no test; the table is also written to
``benchmarks/results/gpu_check.json``.

Where there is no GPU (no NVIDIA device node, NVML sees none) it prints "no CUDA GPU:
nothing to check" and exits 0, not 77 (automake's "skipped"): make reads any other status
as a failure, and a CPU box or CI that runs every target has nothing wrong to report. A
box with NVIDIA device nodes whose GPUs NVML or torch cannot use exits 1, saying why.

``--rehearse`` runs the same code on a box without a GPU: the same pytest selection (its
tests skip, each saying why; a check that matches no test fails), and the benchmark's
one-device mode on one CPU slot (a strategy it could not measure, the box's load having
swung since its timing run, is "not measured" there, FAILED on a GPU box). The tests in
``tests/gpu/test_gpu_check.py`` run it, so that a typo here is found before anyone has a
GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import os
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from benchmarks import overhead
from benchmarks.common import print_table, save
from tests.stack import REPO

# The named checks and the tests each one is (node id prefixes); every other gpu-marked
# test is reported in one more row.
CHECKS: dict[str, tuple[str, ...]] = {
    "single, dp, ddp jobs on CUDA (NCCL)": (
        "tests/gpu/test_cuda_jobs.py::test_single_dp_and_ddp_jobs_train_to_the_same_weights[cuda]",
    ),
    "strategy invariance on CUDA": (
        "tests/workers/ranks/test_strategies.py::test_single_dp_and_ddp_end_with_the_same_weights[cuda]",
    ),
    "bf16 on CUDA": (
        "tests/workers/ranks/test_strategies.py::test_bf16_trains_under_autocast[cuda]",
    ),
    "cancel frees the GPU (NVML)": (
        "tests/gpu/test_cuda_jobs.py::test_a_cancelled_ddp_job_has_left_its_gpu",
    ),
    "worker on CUDA_VISIBLE_DEVICES subset": ("tests/gpu/test_visible_devices.py::",),
    "NVML lists a CUDA context": (
        "tests/workers/supervisor/test_gpu_release.py::test_nvml_lists_a_child_that_holds_a_cuda_context",
    ),
    "small jobs share a GPU (gpu_memory_gb)": ("tests/gpu/test_gpu_shares.py::",),
}
OTHER = "other gpu tests"
NOTHING_TO_CHECK = "no CUDA GPU: nothing to check"
# The gpu tests take 3-4 minutes on one GPU; pytest's own per-test timeout is 300 s.
PYTEST_TIMEOUT_S = 480
# Each side's training in the benchmark's turns, per strategy (three strategies).
BENCH_SECONDS = 15.0
BENCH_TURN_S = 1.0
FAILED, PASSED, SKIPPED, MISSING = "FAILED", "passed", "skipped", "MISSING"


@dataclass(frozen=True)
class Outcome:
    """One test's end, as pytest's JUnit XML says."""

    nodeid: str
    outcome: str  # passed, failed, error or skipped
    seconds: float
    message: str = ""


@dataclass
class Row:
    """One line of the table."""

    check: str
    result: str
    figure: str
    failing: bool = field(default=False, repr=False)

    def as_dict(self) -> dict[str, str]:
        return {"check": self.check, "result": self.result, "figure": self.figure}


def gpu_names() -> tuple[list[str] | None, str | None]:
    """The GPUs NVML sees, by name, and the driver's version; (None, None) where NVML
    cannot start (no driver)."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return None, None
    try:
        names = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))
            names.append(name.decode() if isinstance(name, bytes) else name)
        driver = pynvml.nvmlSystemGetDriverVersion()
        return names, driver.decode() if isinstance(driver, bytes) else driver
    finally:
        pynvml.nvmlShutdown()


def box_row(names: list[str] | None, driver: str | None, *, rehearsal: bool) -> Row:
    """What was checked: the GPUs, the driver, torch and its CUDA."""
    software = f"torch {torch.__version__}, CUDA {torch.version.cuda}"
    if rehearsal:
        return Row("GPUs, driver, torch", "rehearsal", f"no GPU used; {software}")
    return Row(
        "GPUs, driver, torch",
        "found",
        f"{len(names or [])} x {', '.join(sorted(set(names or [])))}; driver {driver}; {software}",
    )


def why_unusable(names: list[str] | None, nodes: list[str], torch_cuda: str | None) -> str | None:
    """Why a box with NVIDIA hardware cannot be checked (None: it can)."""
    if not names:
        return f"NVIDIA device nodes {nodes} but NVML sees no GPU: is the driver loaded?"
    if torch_cuda is None:
        return f"NVML sees {names} but torch {torch.__version__} is a CPU build"
    return None


def run_gpu_tests(junit: Path, timeout_s: float = PYTEST_TIMEOUT_S) -> tuple[int, list[Outcome]]:
    """Every gpu-marked test in one pytest run, serially (they share the GPU); pytest's
    exit status and each test's outcome."""
    command = [
        sys.executable, "-m", "pytest", "-m", "gpu", "-p", "no:cacheprovider", "-q",
        "-o", "junit_family=xunit1", f"--junitxml={junit}",
    ]  # fmt: skip
    # In a session of its own: past the deadline, the servers and workers its tests
    # started go with it (SIGTERM first: a worker then stops its jobs).
    pytest = subprocess.Popen(command, cwd=REPO, start_new_session=True)
    try:
        status = pytest.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        status = -1
        for sig, grace_s in ((signal.SIGTERM, 30), (signal.SIGKILL, None)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pytest.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                pytest.wait(timeout=grace_s)
                break
    return status, read_junit(junit) if junit.exists() else []


def read_junit(path: Path) -> list[Outcome]:
    """The outcomes in a JUnit XML file written with ``junit_family=xunit1`` (which names
    each test's file, so its node id can be rebuilt)."""
    found = []
    for case in ET.parse(path).getroot().iter("testcase"):
        file, name, where = case.get("file", ""), case.get("name", ""), case.get("classname", "")
        module = file.removesuffix(".py").replace("/", ".")
        inside = where.removeprefix(module + ".") if where.startswith(module + ".") else ""
        nodeid = "::".join(p for p in (file or where, inside, name) if p)
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            if (child := case.find(tag)) is not None:
                outcome = {"failure": "failed"}.get(tag, tag)
                message = child.get("message", "")
                break
        found.append(Outcome(nodeid, outcome, float(case.get("time", 0)), message))
    return found


def check_rows(outcomes: list[Outcome], status: int, *, rehearsal: bool) -> list[Row]:
    """A row per named check, one for every other gpu test, and one for pytest itself
    when it ended in a way its tests do not show (a collection error, a timeout)."""
    rows = []
    claimed: set[str] = set()
    for check, prefixes in CHECKS.items():
        mine = [o for o in outcomes if o.nodeid.startswith(prefixes)]
        claimed.update(o.nodeid for o in mine)
        rows.append(verdict(check, mine, skip_fails=not rehearsal))
    others = [o for o in outcomes if o.nodeid not in claimed]
    # Another gpu test may need what this box lacks (two GPUs, say): its skip is shown.
    rows.append(verdict(OTHER, others, skip_fails=False, may_be_empty=True))
    if status not in (0, 1):  # 1: some test failed, shown in its row
        why = f"timed out after {PYTEST_TIMEOUT_S} s" if status < 0 else f"exited {status}"
        rows.append(Row("pytest", FAILED, f"pytest -m gpu {why}", failing=True))
    return rows


def verdict(
    check: str, outcomes: list[Outcome], *, skip_fails: bool, may_be_empty: bool = False
) -> Row:
    """A check's row: FAILED if a test failed; skipped if one skipped (a failure where
    ``skip_fails``: a named check on a GPU box, where each must run); MISSING if no test
    matched (a typo, or a renamed test)."""
    if not outcomes:
        if may_be_empty:
            return Row(check, "none", "")
        return Row(check, MISSING, "no gpu-marked test matched", failing=True)
    seconds = sum(o.seconds for o in outcomes)
    for o in outcomes:
        if o.outcome in ("failed", "error"):
            return Row(check, FAILED, f"{o.nodeid}: {o.message}"[:200], failing=True)
    skipped = [o for o in outcomes if o.outcome == "skipped"]
    if skipped:
        reasons = "; ".join(sorted({o.message for o in skipped}))
        figure = f"{len(outcomes) - len(skipped)} passed, {len(skipped)} skipped: {reasons}"
        return Row(check, SKIPPED, figure[:200], failing=skip_fails)
    return Row(check, PASSED, f"{len(outcomes)} passed in {seconds:.0f} s")


def bench_rows(
    device: str, seconds: float, turn_s: float, samples: int, *, rehearsal: bool
) -> list[Row]:
    """The overhead benchmark's one-device mode, a row per strategy. In a rehearsal, a
    run that gave nothing to compare (the box's speed swung) is said, not failed: the path
    ran, and only the box's own load decided the figure."""
    rows = []
    for strategy in overhead.ONE_DEVICE:
        case = overhead.Case(strategy, 1, device, samples)
        check = f"overhead {case.name} on {device}"
        try:
            rows.append(bench_row(overhead.one_case(case, seconds, turn_s)))
        except overhead.NoSteadyState as exc:
            said = "not measured" if rehearsal else FAILED
            rows.append(Row(check, said, str(exc), failing=not rehearsal))
        except Exception as exc:  # the table still comes out, with the reason
            rows.append(Row(check, FAILED, f"{type(exc).__name__}: {exc}"[:200], True))
    return rows


def bench_row(m: dict[str, Any]) -> Row:
    """One strategy's steady state as a row: its samples/s against the bare script's."""
    low, high = m["like_for_like_95pct"]
    figure = (
        f"{m['trainyard_samples_per_s']:,.0f} vs bare {m['bare_batched_samples_per_s']:,.0f}"
        f" samples/s: {m['ratio_like_for_like']:.3f}x ({low:.3f}-{high:.3f}, {m['rounds']}"
        f" rounds); service CPU {m['service_cpu_pct_of_training']}%"
    )
    return Row(f"overhead {m['strategy']}", "measured", figure)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rehearse", action="store_true", help="the same path, on CPU")
    parser.add_argument("--seconds", type=float, default=BENCH_SECONDS, help="benchmark length")
    parser.add_argument("--turn", type=float, default=BENCH_TURN_S, help="benchmark turns")
    parser.add_argument(
        "--samples", type=int, default=overhead.SAMPLES, help="benchmark epoch (fewer: faster)"
    )
    parser.add_argument("--no-bench", action="store_true", help="the tests only")
    args = parser.parse_args()
    nodes = sorted(glob.glob("/dev/nvidia[0-9]*"))
    names, driver = gpu_names()
    if not args.rehearse:
        if not nodes and not names:
            print(NOTHING_TO_CHECK)
            return 0
        if why := why_unusable(names, nodes, torch.version.cuda):
            print(f"gpu-check: {why}")
            return 1
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        status, outcomes = run_gpu_tests(Path(tmp) / "gpu.xml")
    rows = [box_row(names, driver, rehearsal=args.rehearse)]
    rows += check_rows(outcomes, status, rehearsal=args.rehearse)
    if not args.no_bench:
        device = "cpu" if args.rehearse else "cuda"
        rows += bench_rows(device, args.seconds, args.turn, args.samples, rehearsal=args.rehearse)
    minutes = (time.monotonic() - started) / 60
    where = "rehearsal on CPU" if args.rehearse else "this box's GPUs"
    print_table(f"gpu-check: {where}, {minutes:.1f} min", [r.as_dict() for r in rows])
    if not args.rehearse:
        save("gpu_check", {"gpus": names, "driver": driver, "rows": [r.as_dict() for r in rows]})
    failing = [r.check for r in rows if r.failing]
    if failing:
        print(f"\ngpu-check failed: {', '.join(failing)}")
    return 1 if failing else 0


if __name__ == "__main__":
    sys.exit(main())
