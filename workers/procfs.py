"""What /proc says about processes: their state, group, session, start time and children;
the kill of a process tree, and of what a dead supervisor left behind. Linux only, like
the rest of the worker."""

from __future__ import annotations

import contextlib
import math
import os
import signal
import time
from collections.abc import Iterator


def stat_fields(pid: int) -> list[str]:
    """Fields of /proc/PID/stat after "pid (comm)": [0] is state, [1] ppid, [2] pgrp,
    [3] session; empty if the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return []
    return stat[stat.rindex(")") + 2 :].split()


def _live() -> Iterator[tuple[int, list[str]]]:
    """Each live (non-zombie) process's pid and ``stat_fields``, read from /proc."""
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            fields = stat_fields(int(entry.name))
            if fields and fields[0] not in ("Z", "X"):
                yield int(entry.name), fields


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes whose process group is ``pgid``, read from /proc."""
    return [pid for pid, fields in _live() if int(fields[2]) == pgid]


def kill_tree(pid: int) -> list[int]:
    """SIGKILL a process and every process below it; returns their pids.

    Each is stopped first (SIGSTOP), and /proc is read again until no new one shows: a
    stopped process forks no more, and its children stay its own until the SIGKILL. This
    follows parents, not groups, so a process that left its group or session is found;
    one already re-parented away (a double fork, done before the stop) is not."""
    stopped: list[int] = []
    while found := [p for p in [pid, *_below(pid)] if p not in stopped]:
        for p in found:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGSTOP)
        stopped += found
    for p in stopped:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)
    return stopped


def _below(pid: int) -> list[int]:
    """Live processes descended from ``pid`` (children, theirs, ...), read from /proc."""
    children: dict[int, list[int]] = {}
    for child, fields in _live():
        children.setdefault(int(fields[1]), []).append(child)
    found: list[int] = []
    todo = [pid]
    while todo:
        below = children.get(todo.pop(), [])
        found += below
        todo += below
    return found


def session_of(pid: int) -> int | None:
    """The session a process belongs to (None if it is gone)."""
    fields = stat_fields(pid)
    return int(fields[3]) if fields else None


def start_time(pid: int) -> float:
    """When a process started, in Unix seconds (inf if it is gone)."""
    fields = stat_fields(pid)
    if not fields:
        return math.inf
    ticks = int(fields[19])  # field 22 of stat: start time in clock ticks after boot
    return boot_time() + ticks / os.sysconf("SC_CLK_TCK")


def boot_time() -> float:
    """When this machine booted, in Unix seconds."""
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("btime "):
                return float(line.split()[1])
    raise RuntimeError("no btime in /proc/stat")


def kill_leftovers(session_id: int, started_before: float, timeout_s: float) -> int:
    """SIGKILL what is left of an attempt whose supervisor died; returns how many.

    The runner led its own session, and every rank and loader worker stays in it. Linux
    does not reuse an id while a process still uses it as a session id, so the members
    of that session are ours, unless all of them died and the id came back for a new
    session: such processes started after ``started_before`` (Unix seconds: when the
    dead supervisor's lease on the job ran or runs out) and are left alone.
    """
    pids = [
        pid for pid in group_members(session_id)
        if session_of(pid) == session_id and start_time(pid) <= started_before
    ]  # fmt: skip
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout_s
    while any(pid in group_members(session_id) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)  # the kill is sent; only its delivery is waited for, briefly
    return len(pids)
