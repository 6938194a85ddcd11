"""One attempt's runner process group, as the supervisor sees it: its logs, its stop and
kill, and the state the supervisor keeps about it (lease renewals, steps seen, why it was
stopped, the wait for its GPUs). How the process is started is ``workers.supervisor.launch``'s."""

from __future__ import annotations

import codecs
import contextlib
import logging
import math
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from typing import IO

from service.store import Claim
from workers.handoff import JobAccount
from workers.outcome import StopReason
from workers.procfs import group_members
from workers.stdio import MAX_LINE_CHARS
from workers.supervisor.cache_budget import Holds
from workers.supervisor.reporter import DbReporter
from workers.zygote import ZygoteProcess

Process = subprocess.Popen[bytes] | ZygoteProcess

log = logging.getLogger(__name__)


class HandOffGuard:
    """Between an attempt's hand-off thread and its end: the folder is handed to the job's
    account only while the attempt has not ended (the supervisor takes it back then)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ended = False


class Attempt:
    """A runner started in a new session, so its pgid names every process of the attempt.

    Two threads use an attempt: the supervisor's loop (claim, heartbeat, supervise,
    finish) and the lease watchdog (which may decide at any moment that the lease is
    lost). ``_state`` guards what both touch: the stop reason, the kill deadline and the
    last renewal. Without it, a cancel seen by the loop could overwrite a lease_lost the
    watchdog had just set, and the loop would then write an outcome for a job that is
    no longer this worker's. The rest is the loop's alone (steps seen, the GPU wait).
    """

    def __init__(
        self,
        claim: Claim,
        devices: list[int],
        proc: Process,
        stdout: IO[bytes],
        stderr: IO[bytes],
        on_exit: Callable[[], None] | None = None,
        *,
        claimed_at: float | None = None,
    ) -> None:
        """``on_exit`` is called (from a thread) once both pipes closed: every process of
        the attempt closed them, usually by exiting (it may not be reapable just yet).
        ``claimed_at`` (monotonic) is when the claim was asked for: its lease runs from
        then."""
        self.fence = claim.fence
        self.job_id = claim.fence.job_id
        self.script = claim.script
        self.devices = devices
        self.share_gb = claim.gpu_memory_gb  # of its one GPU; None: its devices whole
        self.preempted_by: str | None = None  # who it was stopped for (StopReason.preempted)
        self.node: int | None = None  # a job across boxes: this worker's node of it
        self.lost_node: str | None = None  # the other node it stopped for (node_lost)
        self.owner = claim.owner  # charged for its devices' time (fair share)
        self.proc = proc
        self.pgid = proc.pid  # start_new_session: the runner leads its own group
        self.started = time.monotonic()
        self.timeout_s = claim.timeout_s
        self.charged_until = self.started  # monotonic: its usage is charged up to here
        self.pids_seen: set[int] = set()  # every process of the group, for the GPU check
        # Reentrant: the supervisor's SIGTERM handler (stop -> request_stop) runs in the
        # loop's thread between two bytecodes, possibly while that thread holds it.
        self._state = threading.RLock()  # see the class docstring
        self._stop_reason: StopReason | None = None
        self._kill_at: float | None = None
        # When the lease was last extended (the claim started it): the lease watchdog
        # kills the attempt once this is a whole lease ago.
        self._renewed_at = self.started if claimed_at is None else claimed_at
        self._last_step: int | None = None  # progress watchdog: the step last seen ...
        self._last_advance = self.started  # ... and when it last moved
        self._gpu_wait_since: float | None = None
        self._ended_noted = False  # the "attempt ended" log line was written
        self._lines: list[tuple[float, str, str]] = []
        self._lock = threading.Lock()  # the log lines and open pipes (the pump threads)
        self.reporter: DbReporter | None = None  # stores rank 0's points (the supervisor's)
        self.hand_off = HandOffGuard()  # its launch's hand-off thread, and its end
        self.account: JobAccount | None = None  # what its processes run as (walls)
        self.cache_holds: Holds | None = None  # the cache entries it uses, until it ends
        self._on_exit = on_exit
        self._open_pipes = 2
        self._pumps = [
            threading.Thread(target=self._pump, args=(pipe, name), daemon=True)
            for pipe, name in ((stdout, "stdout"), (stderr, "stderr"))
        ]
        for t in self._pumps:
            t.start()

    # --- log lines -----------------------------------------------------------------

    def note(self, text: str) -> None:
        """Add a line of the supervisor's own to the job's log."""
        with self._lock:
            self._lines.append((time.time(), "system", text))

    def note_ended(self, text: str) -> None:
        """Note how the attempt ended, once (a finish retried after a database outage);
        its first line: a script's reason goes on with its last lines on stderr, which
        the log has already."""
        if not self._ended_noted:
            self.note(text.partition("\n")[0])
            self._ended_noted = True

    def take_lines(self) -> list[tuple[float, str, str]]:
        with self._lock:
            lines, self._lines = self._lines, []
        return lines

    def put_back(self, lines: list[tuple[float, str, str]]) -> None:
        """Return lines a failed write could not store, to be tried again first."""
        with self._lock:
            self._lines[:0] = lines

    def _pump(self, pipe: IO[bytes] | None, stream: str) -> None:
        assert pipe is not None
        # A line longer than MAX_LINE_CHARS bytes (a progress bar printed without newlines,
        # say) comes in pieces, as it is written: never read whole, however long it grows.
        # The decoder keeps a character that two pieces cut through whole.
        decode = codecs.getincrementaldecoder("utf-8")("replace").decode
        for raw in iter(lambda: pipe.readline(MAX_LINE_CHARS), b""):
            text = decode(raw).rstrip("\n")
            with self._lock:
                self._lines.append((time.time(), stream, text))
        pipe.close()
        with self._lock:
            self._open_pipes -= 1
            closed = self._open_pipes == 0
        if closed and self._on_exit is not None:
            self._on_exit()

    def close_reporter(self) -> None:
        """Store what rank 0 reported last, and stop following its points."""
        if self.reporter is not None:
            self.reporter.close()

    def join_pumps(self, timeout_s: float = 5.0) -> None:
        """Wait until both pipes reached EOF (every process holding them is gone)."""
        deadline = time.monotonic() + timeout_s
        for t in self._pumps:
            t.join(max(0.0, deadline - time.monotonic()))

    # --- the lease and progress ------------------------------------------------------

    def renewed(self, at: float) -> None:
        """The lease was extended, as asked at ``at`` (monotonic; it runs from then)."""
        with self._state:
            self._renewed_at = at

    def lease_left(self, now: float, lease_s: float) -> float:
        """Seconds until the lease lapses unless renewed (negative once it has)."""
        with self._state:
            return self._renewed_at + lease_s - now

    def lease_lapsed(self, now: float, lease_s: float) -> bool:
        """True once: the lease was not renewed for a whole lease, so the attempt is
        marked lease_lost and killed."""
        # Checked and marked under one hold of the lock: a renewal the loop records in
        # between would otherwise not save the attempt from the kill.
        with self._state:
            if self._renewed_at + lease_s >= now:
                return False
            return self.lose_lease(f"not renewed for {lease_s:.0f}s")

    def lose_lease(self, why: str) -> bool:
        """The job is not (provably) this worker's any more: its runner must not train on,
        and nothing more is written about it. Overrides any earlier stop reason; False if
        the lease was already lost."""
        with self._state:
            if self._stop_reason == StopReason.lease_lost:
                return False
            self._stop_reason = StopReason.lease_lost
        log.error("job %s: lease lost (%s); killing its runner", self.job_id, why)
        self.signal(signal.SIGKILL)
        return True

    @property
    def lease_lost(self) -> bool:
        return self.stop_reason == StopReason.lease_lost

    def saw_step(self, step: int | None, now: float) -> float:
        """Record the step the job last reported; returns how long it has not moved.

        A script that has reported no step yet is not judged: it may never report one."""
        if step is None and self.script:
            self._last_advance = now
        if step != self._last_step:
            self._last_step, self._last_advance = step, now
        return now - self._last_advance

    # --- fair share ----------------------------------------------------------------

    def uncharged(self, now: float) -> float:
        """Device-seconds held since the last charge. A share of a GPU counts as one
        device: fair share weighs the GPUs a job keeps from others, and a share keeps
        others off its GPU's compute, if not all of its memory."""
        devices = 1 if self.share_gb is not None else len(self.devices)
        return devices * max(0.0, now - self.charged_until)

    # --- stopping ----------------------------------------------------------------

    @property
    def stop_reason(self) -> StopReason | None:
        """Why the supervisor stopped the attempt (None: it was not stopped)."""
        with self._state:
            return self._stop_reason

    def request_stop(self, reason: StopReason, grace_s: float) -> None:
        """SIGTERM the whole group now, SIGKILL it after ``grace_s`` (see ``enforce``).
        The first reason stands: a later one (a shutdown during a cancel) changes nothing."""
        with self._state:
            if self._stop_reason is not None:
                return
            self._stop_reason = reason
            self._kill_at = time.monotonic() + grace_s
        log.info("job %s: stopping attempt (%s)", self.job_id, reason)
        self.signal(signal.SIGTERM)

    def enforce(self, now: float, grace_s: float) -> None:
        """Apply the timeout and the kill deadline."""
        if self.timeout_s is not None and now - self.started > self.timeout_s:
            self.request_stop(StopReason.timeout, grace_s)
        with self._state:
            kill_at = self._kill_at
        if kill_at is not None and now >= kill_at:
            self.signal(signal.SIGKILL)
        if self.proc.poll() is not None and self.alive():
            # The runner is gone but ranks or loader workers of its group are not:
            # without their parent they can only hold devices, so they go now.
            self.signal(signal.SIGKILL)

    def signal(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pgid, sig)

    def alive(self) -> bool:
        """Whether any process of the attempt's group is still running (zombies aside)."""
        members = group_members(self.pgid)
        self.pids_seen.update(members)
        return bool(members)

    def exiting(self) -> bool:
        """Its output pipes closed or its runner exited: ``finished`` is near."""
        with self._lock:
            closed = self._open_pipes == 0
        return closed or self.proc.poll() is not None

    def next_deadline(self) -> float:
        """When ``enforce`` next has something to do (monotonic; inf if never)."""
        deadlines = [math.inf]
        with self._state:
            if self._kill_at is not None:
                deadlines.append(self._kill_at)
            if self.timeout_s is not None and self._stop_reason is None:
                deadlines.append(self.started + self.timeout_s)
        return min(deadlines)

    def finished(self) -> bool:
        """The runner exited and no process of its group remains."""
        return self.proc.poll() is not None and not self.alive()

    def gpus_released(self, listed: set[int] | None, now: float, grace_s: float) -> bool:
        """Whether its GPUs may go to the next job, given the pids NVML ``listed`` on them:
        once none of this attempt's processes is listed (a driver can hold a context a
        moment past the process's exit), or after ``grace_s`` of waiting, never forever."""
        holding = (listed or set()) & self.pids_seen
        if not holding:
            return True
        self._gpu_wait_since = self._gpu_wait_since or now
        if now - self._gpu_wait_since < grace_s:
            return False
        log.error(
            "job %s: NVML still lists pids %s on GPUs %s after %.0fs; releasing them anyway",
            self.job_id,
            sorted(holding),
            self.devices,
            now - self._gpu_wait_since,
        )
        return True
