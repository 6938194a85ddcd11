"""A job's output on its way to log lines: the ranks' line prefixer and
the supervisor's pump hold at most a line's worth of output without a newline (a progress
bar's ``\\r`` redraws), and relay it in pieces as it comes."""

from __future__ import annotations

import io
import subprocess
import sys

from service.models import Strategy
from service.store import Claim, Fence
from tests.stack import wait_for
from workers.stdio import MAX_LINE_CHARS, LinePrefixer
from workers.supervisor.attempt import Attempt

PREFIX = "[rank 0] "


def test_a_line_without_end_is_relayed_in_pieces_as_it_grows() -> None:
    target = io.StringIO()
    prefixer = LinePrefixer(target, PREFIX)
    chunk = "0123456789" * 100
    for _ in range(1000):  # 1 MB, never a newline, in the small writes a bar makes
        prefixer.write(chunk)
        assert prefixer._pending_chars <= MAX_LINE_CHARS  # what it holds stays bounded
    lines = target.getvalue().splitlines()
    assert len(lines) == 1_000_000 // (MAX_LINE_CHARS - len(PREFIX))  # shown as it came
    assert all(line.startswith(PREFIX) and len(line) == MAX_LINE_CHARS for line in lines)
    prefixer.flush()
    relayed = "".join(line.removeprefix(PREFIX) for line in target.getvalue().splitlines())
    assert relayed == chunk * 1000  # nothing lost or repeated


def test_one_huge_write_is_cut_into_pieces_too() -> None:
    target = io.StringIO()
    LinePrefixer(target, PREFIX).write("y" * 100_000 + "\n")
    lines = target.getvalue().splitlines()
    assert max(map(len, lines)) == MAX_LINE_CHARS
    assert "".join(line.removeprefix(PREFIX) for line in lines) == "y" * 100_000


def test_carriage_returns_end_lines() -> None:
    target = io.StringIO()
    prefixer = LinePrefixer(target, PREFIX)
    for text in ("\r 10%|#  |", "\r 50%|## |", "\r100%|###|", "\n", "done\r\n", "\n", "end"):
        prefixer.write(text)  # a bar's redraws, its closing newline, a blank line
    prefixer.flush()
    assert target.getvalue().splitlines() == [
        f"{PREFIX} 10%|#  |",
        f"{PREFIX} 50%|## |",
        f"{PREFIX}100%|###|",
        f"{PREFIX}done",
        PREFIX,
        f"{PREFIX}end",
    ]


def test_the_supervisor_relays_a_line_without_end_before_it_ends() -> None:
    """A runner that writes 1 MB without a newline and then waits: its log already holds
    all but the last piece (the pump used to read it whole, and hold it, until a newline
    came), and the rest once it ends."""
    writes_then_waits = (
        "import sys; sys.stdout.write('x' * 1_000_000); sys.stdout.flush(); sys.stdin.read()"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", writes_then_waits],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdin and proc.stdout and proc.stderr
    claim = Claim(Fence(1, 1, "token"), devices=1, strategy=Strategy.single, timeout_s=None)
    attempt = Attempt(claim, [0], proc, proc.stdout, proc.stderr)
    taken: list[str] = []

    def relayed(at_least: int) -> bool:
        taken.extend(text for _, stream, text in attempt.take_lines() if stream == "stdout")
        return sum(map(len, taken)) >= at_least

    try:
        wait_for(lambda: relayed(1_000_000 - MAX_LINE_CHARS), 30, "output while it runs")
        assert proc.poll() is None
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)
        attempt.join_pumps()
    assert relayed(1_000_000) and "".join(taken) == "x" * 1_000_000
    assert max(map(len, taken)) <= MAX_LINE_CHARS
