"""One attempt's runner process group, as the supervisor sees it: start, logs, stop, kill."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

from service.models import Job
from service.store import Fence

log = logging.getLogger(__name__)

# A line longer than this is cut (a progress bar printed without newlines, say).
MAX_LINE_CHARS = 8192
# Set in every process of an attempt (ranks inherit it), so a restarted worker can tell
# the processes it left behind from unrelated ones that happen to reuse a process group id.
MARKER_ENV = "TRAINYARD_ATTEMPT"


def attempt_marker(job: Job) -> str:
    """The value of MARKER_ENV for a job's current attempt."""
    return f"{job.id}:{job.attempt}"


class Attempt:
    """A runner started in a new session, so its pgid names every process of the attempt."""

    def __init__(self, job: Job, devices: list[int], proc: subprocess.Popen[bytes]) -> None:
        assert job.id is not None and job.lease_token is not None
        self.job_id = job.id
        self.fence = Fence(job.id, job.attempt, job.lease_token)
        self.devices = devices
        self.proc = proc
        self.pgid = proc.pid  # start_new_session: the runner leads its own group
        self.started = time.monotonic()
        self.timeout_s = job.timeout_s
        self.stop_reason: str | None = None  # cancel|timeout|stalled|shutdown|lease_lost
        self.kill_at: float | None = None
        self.last_step: int | None = None  # progress watchdog: the step last seen ...
        self.last_advance = self.started  # ... and when it last moved
        self._lines: list[tuple[float, str, str]] = []
        self._lock = threading.Lock()
        self._pumps = [
            threading.Thread(target=self._pump, args=(pipe, name), daemon=True)
            for pipe, name in ((proc.stdout, "stdout"), (proc.stderr, "stderr"))
        ]
        for t in self._pumps:
            t.start()

    @classmethod
    def start(
        cls,
        job: Job,
        devices: list[int],
        *,
        accelerator: str,
        threads: int,
        env: dict[str, str],
        cwd: Path | None = None,
    ) -> Attempt:
        """Start ``python -m workers.runner`` for the job's attempt."""
        cmd = [
            sys.executable,
            "-m",
            "workers.runner",
            "--job-id",
            str(job.id),
            "--attempt",
            str(job.attempt),
            "--lease-token",
            str(job.lease_token),
            "--accelerator",
            accelerator,
            "--threads",
            str(threads),
        ]
        env = {
            **env,
            "PYTHONUNBUFFERED": "1",  # lines reach the logs as printed, even on a crash
            MARKER_ENV: attempt_marker(job),
        }
        if accelerator == "cuda":
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, devices))
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            cwd=cwd,
            start_new_session=True,
        )
        return cls(job, devices, proc)

    def note(self, text: str) -> None:
        """Add a line of the supervisor's own to the job's log."""
        with self._lock:
            self._lines.append((time.time(), "system", text))

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
        for raw in iter(pipe.readline, b""):
            text = raw.decode("utf-8", "replace").rstrip("\n")[:MAX_LINE_CHARS]
            with self._lock:
                self._lines.append((time.time(), stream, text))
        pipe.close()

    def join_pumps(self, timeout_s: float = 5.0) -> None:
        """Wait until both pipes reached EOF (every process holding them is gone)."""
        deadline = time.monotonic() + timeout_s
        for t in self._pumps:
            t.join(max(0.0, deadline - time.monotonic()))

    # --- stopping ----------------------------------------------------------------

    def request_stop(self, reason: str, grace_s: float) -> None:
        """SIGTERM the whole group now, SIGKILL it after ``grace_s`` (see ``enforce``)."""
        if self.stop_reason is not None:
            return
        self.stop_reason = reason
        self.kill_at = time.monotonic() + grace_s
        log.info("job %s: stopping attempt (%s)", self.job_id, reason)
        self.signal(signal.SIGTERM)

    def enforce(self, now: float, grace_s: float) -> None:
        """Apply the timeout and the kill deadline."""
        if self.timeout_s is not None and now - self.started > self.timeout_s:
            self.request_stop("timeout", grace_s)
        if self.kill_at is not None and now >= self.kill_at:
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
        return bool(group_members(self.pgid))

    def finished(self) -> bool:
        """The runner exited and no process of its group remains."""
        return self.proc.poll() is not None and not self.alive()


def kill_leftovers(pgid: int, marker: str, timeout_s: float) -> int:
    """SIGKILL the processes of group ``pgid`` that carry ``marker``; wait until they are gone."""
    pids = [pid for pid in group_members(pgid) if _environ_has(pid, f"{MARKER_ENV}={marker}")]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout_s
    while any(pid in group_members(pgid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return len(pids)


def _environ_has(pid: int, entry: str) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return entry.encode() in f.read().split(b"\0")
    except OSError:
        return False


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes whose process group is ``pgid``, read from /proc."""
    members = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "
        state, pgrp = fields[0], int(fields[2])
        if pgrp == pgid and state not in ("Z", "X"):
            members.append(int(entry.name))
    return members
