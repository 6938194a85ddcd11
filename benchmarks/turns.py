"""Programs that take turns at the whole machine, to compare their speed side by side.

On a shared machine the same code runs ±20% faster or slower from one ten-second stretch
to the next (seen here: one bare script at 104,000 then 62,000 samples/s, two runs apart).
Two programs run one after the other see different machines; two run at once fight for
the cores. Here each group of processes runs alone for a turn while every other group is
stopped (SIGSTOP), then the next one goes (SIGCONT): drift slower than a turn hits every
group alike, and no group ever shares the cores with another.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from workers.procfs import stat_fields

Window = tuple[float, float]  # a turn's (start, end), in time.time() seconds


def descendants(roots: Iterable[int]) -> set[int]:
    """``roots`` and every process below them (read from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and (fields := stat_fields(int(entry.name))):
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found: set[int] = set()
    todo = list(roots)
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, []))
    return found


def cpu_seconds(pids: Iterable[int]) -> dict[int, float]:
    """User + system CPU seconds each live process has used so far."""
    tick = os.sysconf("SC_CLK_TCK")
    found = {}
    for pid in pids:
        if (fields := stat_fields(pid)) and fields[0] not in ("Z", "X"):
            found[pid] = (int(fields[11]) + int(fields[12])) / tick
    return found


def _signal(pids: Iterable[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


@dataclass
class Group:
    """Processes that run together: ``roots()`` names their top processes (children are
    found below them at each turn, as they appear); ``done()`` is asked at the end of
    each of the group's turns, while it still runs."""

    name: str
    roots: Callable[[], list[int]]
    done: Callable[[], bool]
    windows: list[Window] = field(default_factory=list)

    def stop(self) -> None:
        # Again until nothing new turns up: a process forked just before its parent
        # stopped would otherwise run on in the others' turns.
        stopped: set[int] = set()
        while new := descendants(self.roots()) - stopped:
            _signal(new, signal.SIGSTOP)
            stopped |= new

    def resume(self) -> None:
        _signal(descendants(self.roots()), signal.SIGCONT)


def take_turns(groups: list[Group], turn_s: float) -> None:
    """Run the groups one at a time, ``turn_s`` each, until every group is done; each
    group's turns are left in its ``windows``. Nothing stays stopped afterwards."""
    for g in groups:
        g.stop()
    waiting = list(groups)
    try:
        while waiting:
            for g in list(waiting):
                g.resume()
                start = time.time()
                time.sleep(turn_s)
                finished = g.done()
                g.windows.append((start, time.time()))
                if finished:
                    waiting.remove(g)
                else:
                    g.stop()
    finally:
        for g in groups:
            g.resume()


def progress_in_windows(
    points: list[tuple[int, float]], windows: list[Window], after_step: int
) -> list[tuple[int, float] | None]:
    """(steps, seconds) of progress inside each window, from (step, time) points: from
    the window's first point to its last, counting only points past ``after_step`` (the
    warm-up); None for a window with fewer than two such points."""
    spans: list[tuple[int, float] | None] = []
    for start, end in windows:
        inside = [(s, t) for s, t in points if start <= t <= end and s > after_step]
        ok = len(inside) >= 2
        spans.append((inside[-1][0] - inside[0][0], inside[-1][1] - inside[0][1]) if ok else None)
    return spans
