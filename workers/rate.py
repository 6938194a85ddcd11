"""Steps per second over a sliding window: the ETA of a recipe's progress and of a
script's metrics file."""

from __future__ import annotations

from collections import deque

# The rate is over about this many seconds: steady, yet it follows a job whose speed
# changes (another job starts beside it, say).
RATE_WINDOW_S = 5.0


class StepRate:
    """(clock, step) marks; the rate runs from the mark at or just before the window's
    start to the newest one."""

    def __init__(self, min_steps: int, window_s: float = RATE_WINDOW_S) -> None:
        """``min_steps``: the fewest steps between the two marks for a rate at all."""
        self.min_steps = min_steps
        self.window_s = window_s
        self.marks: deque[tuple[float, int]] = deque()

    @property
    def started(self) -> bool:
        return bool(self.marks)

    def mark(self, clock: float, step: int) -> float | None:
        """Record where the count is at ``clock``; the steps per second now, or None."""
        marks = self.marks
        marks.append((clock, step))
        while len(marks) > 1 and marks[1][0] <= clock - self.window_s:
            marks.popleft()  # the oldest mark left is at or just before the window's start
        since, first = marks[0]
        if step - first >= self.min_steps and clock > since:
            return (step - first) / (clock - since)
        return None
