"""The zygote: children start warm (nothing left to import or set up) and their exits are
reported as subprocess would."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from tests.stack import REPO
from workers.zygote import Zygote, ZygoteProcess

pytestmark = pytest.mark.slow


def test_children_start_warm_and_their_exit_codes_come_back(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    notes = threading.Semaphore(0)
    zygote = Zygote(env, notify=notes.release)
    try:
        # It says when it is warm (the supervisor claims no job before that).
        assert not zygote.ready()
        assert notes.acquire(timeout=120) and zygote.ready()
        with open(os.devnull, "rb") as nothing, open(tmp_path / "out.log", "wb") as out:
            pids = [
                zygote.spawn(
                    "tests.workers.warm_child",
                    [str(tmp_path / f"found-{code}.json"), str(code)],
                    env=env,
                    stdin=nothing.fileno(),
                    stdout=out.fileno(),
                    stderr=out.fileno(),
                )
                for code in (0, 3)
            ]
        children = [ZygoteProcess(zygote, pid) for pid in pids]
        # Each exit is reported as it happens (the supervisor sleeps until told).
        assert notes.acquire(timeout=60) and notes.acquire(timeout=30)
        assert [c.poll() for c in children] == [0, 3], (tmp_path / "out.log").read_text()
        # Between requests and exits it sleeps: a poll loop woke it 50 times a second,
        # each time taking a core from a training job for a moment.
        before = _wakeups(zygote.proc.pid)
        time.sleep(1.0)
        assert _wakeups(zygote.proc.pid) - before <= 2
    finally:
        zygote.close()
    found = json.loads((tmp_path / "found-0.json").read_text())
    # Each of these, left to the child, cost every job's start: torch ~2 s, torch._dynamo
    # ~1.5 s (DDP), the ORM's mapper set-up ~0.2 s. CUDA must stay untouched to fork.
    assert found == {
        "torch": True,
        "dynamo": True,
        "runner": True,
        "mappers_configured": True,
        "cuda_initialized": False,
        "sigchld_default": True,
        "no_wakeup_fd": True,
    }


def _wakeups(pid: int) -> int:
    """How often the process's main thread has gone to sleep and woken since it started."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split("voluntary_ctxt_switches:")[1].split()[0])


def test_a_zygote_closed_before_it_is_warm_is_stopped_not_waited_for() -> None:
    # It only reads its socket once warm; a worker stopped during its imports would wait
    # for them to finish (seconds) to be heard.
    zygote = Zygote({**os.environ, "PYTHONPATH": str(REPO)})
    assert not zygote.ready()
    zygote.close()
    assert zygote.proc.returncode == -signal.SIGTERM
