"""How a script's failure reads and whose it is: its reason ends with the failing rank's
last lines on stderr (the cause a user would otherwise dig out of the log), says which
setting to lower when it ran out of memory, and a script killed from outside is not the
job's own failure (it is retried whatever retries_on_error says)."""

from __future__ import annotations

import gc
import signal
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from service.models import JobStatus
from service.reasons import ReasonCode
from service.store import Outcome
from workers.outcome import RunnerReport, decide
from workers.points_file import PointsFile
from workers.script import job
from workers.script.launch import Script

LIMITS = {"timeout_s": None, "stall_timeout_s": 600.0, "worker_id": "box-1"}


@pytest.fixture(autouse=True)
def sigterm_restored() -> Iterator[None]:
    """``job.run`` takes SIGTERM (checkpoint and stop) for the rest of its process."""
    saved = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, saved)


def ended(tmp_path: Path, source: str, ranks: int | None = None) -> tuple[RunnerReport, Outcome]:
    """Run ``source`` as a script job's entrypoint (once per rank with ``ranks``); its report
    and the outcome the supervisor would record."""
    (tmp_path / "train.py").write_text(textwrap.dedent(source))
    env = {"PATH": "/usr/bin:/bin", "PYTHONUNBUFFERED": "1"}
    script = Script(
        [sys.executable, "train.py"],
        tmp_path,
        env,
        tmp_path / "metrics.jsonl",
        ranks=ranks,
        run_id="trainyard-job-1-attempt-1",
        logs=tmp_path / "logs" if ranks else None,
    )
    report = job.run(script, PointsFile(tmp_path / "points.jsonl"))
    return report, decide(None, report, 1, **LIMITS)  # type: ignore[arg-type]


def test_a_syntax_errors_reason_ends_with_what_python_said(tmp_path: Path) -> None:
    report, outcome = ended(tmp_path, "print('starting')\ndef train()\n    pass\n")
    assert not report.ok and outcome.status == JobStatus.failed
    first, *rest = outcome.reason_message.splitlines()
    assert first == "the script exited with 1"
    assert rest[-1] == "SyntaxError: expected ':'"
    assert '  File "train.py", line 2' in rest, rest  # as in the user's package
    assert outcome.own and outcome.retryable  # the job's own: retried as its spec allows


def test_the_reason_keeps_the_last_lines_within_the_stored_length(tmp_path: Path) -> None:
    source = """
        import sys
        for i in range(50):
            print(f"line {i} " + "x" * 400, file=sys.stderr)
        sys.exit("the last word")
    """
    _, outcome = ended(tmp_path, source)
    lines = outcome.reason_message.splitlines()
    assert lines[0] == "the script exited with 1" and lines[-1] == "the last word"
    assert 1 < len(lines) <= 11 and len(outcome.reason_message) <= 2000


# The elastic launch leaves its per-rank log files of a failed run to the garbage
# collector (torch's, here in the test's own process; a runner exits after it).
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_ddp_the_reason_carries_the_failing_ranks_lines_only(tmp_path: Path) -> None:
    source = """
        import os, sys, time
        if os.environ["RANK"] == "1":
            print("rank one's chatter", file=sys.stderr, flush=True)
            time.sleep(30)  # ended by the launch once rank 0 has failed
        open(os.path.join(os.environ.get("TRAINYARD_INPUT_DIR", "."), "digts.npz"))
    """
    _, outcome = ended(tmp_path, source, ranks=2)
    gc.collect()  # those log files: here, where their warning is expected
    first, *rest = outcome.reason_message.splitlines()
    assert first == "the script rank 0 exited with 1", outcome.reason_message
    assert rest[-1].startswith("FileNotFoundError: [Errno 2] No such file or directory")
    assert "digts.npz" in rest[-1]
    assert not any("chatter" in line or line.startswith("[rank") for line in rest), rest
    assert '  File "train.py", line 6, in <module>' in rest, rest  # not under the worker's


@pytest.mark.parametrize(
    ("raised", "more"),
    [
        # past its share of the box's memory (workers.runner.limits): smaller, or more devices
        ('RuntimeError("DefaultCPUAllocator: can\'t allocate memory: 1 GB")', "the box's memory"),
        # past its GPU (or its share of one): smaller, or more GPU memory
        ('MemoryError("CUDA out of memory. Tried to allocate 4.00 GiB")', "gpu_memory_gb"),
    ],
)
def test_running_out_of_memory_says_which_setting_to_lower(
    tmp_path: Path, raised: str, more: str
) -> None:
    _, outcome = ended(tmp_path, f"raise {raised}\n")
    assert (outcome.reason_code, outcome.retryable) == (ReasonCode.out_of_memory, False)
    first = outcome.reason_message.splitlines()[0]
    assert first.startswith("the script ran out of memory (exited with 1): lower batch_size")
    assert "params" in first and more in first, first


def test_a_script_killed_from_outside_is_not_the_jobs_own_failure(tmp_path: Path) -> None:
    source = """
        import os, signal
        os.kill(os.getpid(), signal.SIGKILL)  # as the kernel's OOM killer would
    """
    _, outcome = ended(tmp_path, source)
    assert outcome.reason_message.startswith("the script killed by SIGKILL")
    assert outcome.retryable and not outcome.own
