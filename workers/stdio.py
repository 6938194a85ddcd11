"""Prefix every line a rank prints with its rank, so merged logs say who printed what."""

from __future__ import annotations

import io
import logging
import sys
from typing import TextIO


class LinePrefixer(io.TextIOBase):
    """A text stream that writes whole lines to ``target``, each behind ``prefix``."""

    def __init__(self, target: TextIO, prefix: str) -> None:
        self.target = target
        self.prefix = prefix
        self.pending = ""

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        text = self.pending + s
        *lines, self.pending = text.split("\n")
        if lines:
            self.target.write("".join(f"{self.prefix}{line}\n" for line in lines))
            self.target.flush()
        return len(s)

    def flush(self) -> None:
        if self.pending:  # a partial line is shown rather than lost at exit
            self.target.write(f"{self.prefix}{self.pending}\n")
            self.pending = ""
        self.target.flush()


def prefix_stdio(prefix: str, job_id: int) -> None:
    """Route this process's stdout/stderr and logging through a line prefixer."""
    sys.stdout = LinePrefixer(sys.__stdout__ or sys.stdout, prefix)
    sys.stderr = LinePrefixer(sys.__stderr__ or sys.stderr, prefix)
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format=f"%(levelname)s %(name)s job={job_id}: %(message)s",
        force=True,
    )
