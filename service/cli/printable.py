"""Text that came from a job, made safe to print on the operator's terminal.

A job's name, log lines, reason and metric names are written by whoever submitted it,
and its code: a terminal obeys escape sequences in them (retitle the window, move the
cursor to rewrite what was shown, on some emulators worse). Every control character but
newline and tab is shown escaped instead, as Python writes it (``\\x1b``, ``\\r``).
"""

from __future__ import annotations

# C0 controls, DEL, and the C1 controls (U+0080-U+009F: a lone U+009B is a CSI to some
# terminals, as "\x1b[" is to all).
_CONTROLS = [*range(0x20), 0x7F, *range(0x80, 0xA0)]
_ESCAPED = {
    code: chr(code).encode("unicode_escape").decode("ascii")
    for code in _CONTROLS
    if chr(code) not in "\n\t"
}


def printable(text: object) -> str:
    """``text`` as a string with its control characters (but newline and tab) escaped."""
    return str(text).translate(_ESCAPED)
