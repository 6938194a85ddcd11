"""SIGTERM, to every process of an attempt, means "checkpoint where you are and stop":
the supervisor sends it (a cancel, a preemption, the worker stopping), and the job's
processes answer it. Light, so that a runner can take it up before torch is imported.
"""

from __future__ import annotations

import signal
import threading


class Preempted(Exception):
    """Training stopped early on request (SIGTERM), after a checkpoint of where it was."""


# Set by SIGTERM (see ``stop_on_sigterm``): finish the step, checkpoint, stop.
STOP_REQUESTED = threading.Event()


def stop_on_sigterm() -> None:
    """Make SIGTERM mean "checkpoint where you are and stop" in this process."""
    signal.signal(signal.SIGTERM, lambda *_: STOP_REQUESTED.set())
