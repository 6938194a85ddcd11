"""The zygote: children start warm (nothing left to import or set up) and their exits are
reported as subprocess would."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from tests.stack import REPO
from workers.zygote import Zygote, ZygoteProcess

pytestmark = pytest.mark.slow


def test_children_start_warm_and_their_exit_codes_come_back(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    zygote = Zygote(env)
    try:
        with open(tmp_path / "out.log", "wb") as out:
            pids = [
                zygote.spawn(
                    "tests.workers.warm_child",
                    [str(tmp_path / f"found-{code}.json"), str(code)],
                    env=env,
                    stdout=out.fileno(),
                    stderr=out.fileno(),
                )
                for code in (0, 3)
            ]
        children = [ZygoteProcess(zygote, pid) for pid in pids]
        deadline = time.monotonic() + 120
        while any(c.poll() is None for c in children) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert [c.returncode for c in children] == [0, 3], (tmp_path / "out.log").read_text()
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
    }
