"""Output without a newline (a progress bar's ``\\r`` redraws) through the ranks' line
prefixer, before and after it bounded the line it holds: the time to relay it and the most
of it held at once.

python -m benchmarks.line_prefixer [MB ...]   (default 1 2 4 10)
"""

from __future__ import annotations

import io
import sys
import time
from typing import TextIO

from benchmarks.common import print_table, save
from workers.stdio import LinePrefixer

WRITE_CHARS = 1024  # a bar's redraw is about this long; print() writes its text at once


class UnboundedPrefixer(io.TextIOBase):
    """The prefixer before it bounded its line (commit 35293de), kept to compare against: it joins
    every write onto the partial line and splits the whole of it again."""

    def __init__(self, target: TextIO, prefix: str) -> None:
        self.target = target
        self.prefix = prefix
        self.pending = ""

    def write(self, s: str) -> int:
        text = self.pending + s
        *lines, self.pending = text.split("\n")
        if lines:
            self.target.write("".join(f"{self.prefix}{line}\n" for line in lines))
        return len(s)


def relay(prefixer: io.TextIOBase, total_chars: int) -> tuple[float, int]:
    """Seconds to write ``total_chars`` without a newline, and the most chars held."""
    chunk = "x" * WRITE_CHARS
    held = 0
    began = time.perf_counter()
    for _ in range(total_chars // WRITE_CHARS):
        prefixer.write(chunk)
        held = max(
            held, len(getattr(prefixer, "pending", "")), getattr(prefixer, "_pending_chars", 0)
        )
    return time.perf_counter() - began, held


def main() -> None:
    sizes = [int(a) for a in sys.argv[1:]] or [1, 2, 4, 10]
    rows = []
    for mb in sizes:
        total = mb * 2**20
        before_s, before_held = relay(UnboundedPrefixer(io.StringIO(), "[rank 0] "), total)
        after_s, after_held = relay(LinePrefixer(io.StringIO(), "[rank 0] "), total)
        rows.append(
            {
                "MB without newline": mb,
                "before s": before_s,
                "after s": after_s,
                "before/after": before_s / after_s,
                "before held chars": before_held,
                "after held chars": after_held,
            }
        )
    print_table(f"line prefixer, {WRITE_CHARS}-char writes, no newline", rows)
    save("line_prefixer", rows)


if __name__ == "__main__":
    main()
