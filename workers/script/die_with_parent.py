"""Run a command that dies with its parent: ``python die_with_parent.py ARGV...``.

torchrun starts each rank in a session of its own, out of reach of the signals the
supervisor sends the attempt's process group. Should torchrun be killed outright
(SIGKILL after the grace period, a lost lease, the worker's restart recovery), its ranks
would live on, holding GPUs and ports. Each rank is started through this file: the
kernel sends it SIGKILL when its parent dies (PR_SET_PDEATHSIG survives the exec), and
the exec leaves the rank's process exactly what the command makes it. Standard library
only; nothing of Trainyard is imported.
"""

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def main() -> None:
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:  # the parent died before the prctl took hold
        sys.exit(1)
    os.execvp(sys.argv[1], sys.argv[1:])


if __name__ == "__main__":
    main()
