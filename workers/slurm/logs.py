"""A batch job's output, followed: Slurm writes each stream of the job (every node's
runner and ranks, their lines prefixed as on a box) to a file in the job's folder on the
shared filesystem, and the worker stores its new lines at each tick."""

from __future__ import annotations

import codecs
import contextlib
import time
from pathlib import Path

from workers.stdio import MAX_LINE_CHARS
from workers.supervisor import nofollow

# Read at most this much of a file per tick: a job printing megabytes a second is
# stored as fast as the database takes it, never read whole into memory.
READ_BYTES = 1 << 20

Line = tuple[float, str, str]  # (time, stream, text), as the store takes log lines


class LogTail:
    """New whole lines of one file, from where the last read stopped; the worker's own
    notes come first."""

    def __init__(self, root: Path, path: Path, stream: str) -> None:
        self.root = root
        self.path = path
        self.stream = stream
        self._offset = 0
        self._partial = ""
        self._decode = codecs.getincrementaldecoder("utf-8")("replace").decode
        self._pending: list[Line] = []
        self._done = 0  # the offset the marker last said

    @property
    def _marker(self) -> Path:
        return self.path.with_name(self.path.name + ".stored")

    def resume(self) -> None:
        """Go on from the offset whose lines the store has (a restarted worker adopting
        the attempt), so no line is stored twice; the job could change the marker, which
        would only repeat or skip its own lines."""
        try:
            data = nofollow.read(self.root, self._marker, 32)
        except OSError:
            data = None
        if data and data.strip().isdigit():
            self._offset = int(data)

    def stored(self) -> None:
        """The lines read so far are in the store: remember where they end."""
        done = self._offset - len(self._partial.encode())
        if done != self._done:
            self._done = done
            # a folder the job made unwritable: its lines may repeat after a restart
            with contextlib.suppress(OSError):
                nofollow.write(self.root, self._marker, str(done).encode())

    def note(self, text: str) -> None:
        """A line of the worker's own, for the job's log."""
        self._pending.append((time.time(), "system", text))

    def put_back(self, lines: list[Line]) -> None:
        self._pending[:0] = lines

    def read(self, *, final: bool = False, files: bool = True) -> list[Line]:
        """The lines written since the last read (``final``: the job ended, so a last
        line without its newline counts too). The file is read never through a link: the
        job's account owns the folder it is in. ``files``: False for the notes only."""
        lines, self._pending = self._pending, []
        if not files:  # the notes only
            return lines
        try:
            data = nofollow.read(self.root, self.path, READ_BYTES, self._offset)
        except OSError:  # a link or a FIFO in its place: the job's own doing
            data = None
        now = time.time()
        if data:
            self._offset += len(data)
            text = self._partial + self._decode(data)
            *whole, self._partial = text.split("\n")
            lines += [(now, self.stream, line[:MAX_LINE_CHARS]) for line in whole]
            # a line that never ends is stored in pieces, as on a box
            while len(self._partial) > MAX_LINE_CHARS:
                lines.append((now, self.stream, self._partial[:MAX_LINE_CHARS]))
                self._partial = self._partial[MAX_LINE_CHARS:]
        if final and self._partial:
            lines.append((now, self.stream, self._partial))
            self._partial = ""
        return lines
