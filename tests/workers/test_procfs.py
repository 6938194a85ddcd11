"""A process tree's kill: every process below the one named, whatever group or session
it moved to, with no time left for a stopped parent to fork again."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.stack import wait_for
from workers.procfs import kill_tree, stat_fields


def gone(pid: int) -> bool:
    return stat_fields(pid)[:1] in ([], ["Z"])  # no process, or one only its parent reaps


def test_kill_tree_ends_every_descendant_also_one_in_a_session_of_its_own(
    tmp_path: Path,
) -> None:
    pids = tmp_path / "pids"
    script = f"""
        sleep 600 & echo $! >> {pids}
        setsid sleep 600 & echo $! >> {pids}
        sh -c 'sleep 600 & echo $! >> {pids}; wait' &
        wait
    """
    top = subprocess.Popen(["sh", "-c", script])
    below = wait_for(
        lambda: len(found := pids.read_text().split() if pids.exists() else []) == 3 and found,
        10,
        "three sleepers",
    )
    sleepers = [int(pid) for pid in below]
    assert stat_fields(sleepers[1])[3] != stat_fields(top.pid)[3]  # another session
    killed = kill_tree(top.pid)
    assert top.pid in killed and set(sleepers) <= set(killed)
    assert top.wait(timeout=10) == -9
    wait_for(lambda: all(gone(pid) for pid in sleepers), 10, "every sleeper to be gone")
