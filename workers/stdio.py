"""Prefix every line a rank prints with its rank, so merged logs say who printed what."""

from __future__ import annotations

import io
import logging
import re
import sys
from typing import TextIO

# The longest log line, in characters, prefix included: longer output is relayed in pieces
# of this size, so neither the prefixer nor the supervisor's pump (``workers.supervisor.attempt``,
# which reads at most this many bytes at a time) holds more than this of one line.
MAX_LINE_CHARS = 8192

# A progress bar redraws itself after "\r" without ever printing "\n": each redraw is a
# line of the log (so `trainyard logs -f` shows it move), not a part of one endless line.
_LINE_END = re.compile(r"\r\n|\r|\n")


class LinePrefixer(io.TextIOBase):
    """A text stream that writes whole lines to ``target``, each behind ``prefix``; a line
    ends at ``\\n``, ``\\r`` or ``\\r\\n``, or at ``MAX_LINE_CHARS``. Its cost is linear in
    what is written, however long a line grows."""

    def __init__(self, target: TextIO, prefix: str) -> None:
        self.target = target
        self.prefix = prefix
        self.piece_chars = max(1, MAX_LINE_CHARS - len(prefix))
        self._pending: list[str] = []  # the line so far, in the pieces written
        self._pending_chars = 0
        # The previous line ended with "\r": a "\n" next completes that "\r\n" (it may
        # arrive in the next write) rather than ending an empty line.
        self._after_cr = False

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        out: list[str] = []
        start = 0
        for end in _LINE_END.finditer(s):
            self._add(s[start : end.start()], out)
            separator = end.group()
            if not (separator == "\n" and self._after_cr and not self._pending_chars):
                # an empty line before "\r" is a redraw's leading "\r": nothing to show
                self._end_line(out, keep_empty=separator != "\r")
            self._after_cr = separator == "\r"
            start = end.end()
        if start < len(s):
            self._add(s[start:], out)
            self._after_cr = False
        if out:
            self.target.write("".join(out))
            self.target.flush()
        return len(s)

    def flush(self) -> None:
        if self._pending_chars:  # a partial line is shown rather than lost at exit
            out: list[str] = []
            self._end_line(out, keep_empty=False)
            self.target.write("".join(out))
        self.target.flush()

    def _add(self, text: str, out: list[str]) -> None:
        """Append to the line; each time it would pass the limit, emit it as one piece."""
        at = 0  # slices by index: cutting off the rest each time would copy it again
        while self._pending_chars + len(text) - at > self.piece_chars:
            take = self.piece_chars - self._pending_chars
            self._pending.append(text[at : at + take])
            self._pending_chars += take
            at += take
            self._end_line(out, keep_empty=False)
        if at < len(text):
            self._pending.append(text[at:])
            self._pending_chars += len(text) - at

    def _end_line(self, out: list[str], *, keep_empty: bool) -> None:
        if self._pending_chars or keep_empty:
            out.append(f"{self.prefix}{''.join(self._pending)}\n")
        self._pending.clear()
        self._pending_chars = 0


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
