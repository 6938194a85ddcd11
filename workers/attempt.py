"""One attempt's runner process group, as the supervisor sees it: start, logs, stop, kill."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

from service.artifacts import job_dir
from service.store import Claim
from workers.zygote import Zygote, ZygoteProcess

Process = subprocess.Popen[bytes] | ZygoteProcess

log = logging.getLogger(__name__)

# A line longer than this is cut (a progress bar printed without newlines, say).
MAX_LINE_CHARS = 8192


def outcome_path(data_dir: Path, job_id: int, attempt: int) -> Path:
    """Where the runner leaves how its attempt ended (read by the supervisor)."""
    return job_dir(data_dir, job_id) / ".runner" / f"attempt-{attempt}.json"


class Attempt:
    """A runner started in a new session, so its pgid names every process of the attempt."""

    def __init__(
        self,
        claim: Claim,
        devices: list[int],
        proc: Process,
        stdout: IO[bytes],
        stderr: IO[bytes],
        on_exit: Callable[[], None] | None = None,
    ) -> None:
        """``on_exit`` is called (from a thread) once both pipes closed: every process of
        the attempt closed them, usually by exiting (it may not be reapable just yet)."""
        self.fence = claim.fence
        self.job_id = claim.fence.job_id
        self.devices = devices
        self.proc = proc
        self.pgid = proc.pid  # start_new_session: the runner leads its own group
        self.started = time.monotonic()
        self.timeout_s = claim.timeout_s
        self.stop_reason: str | None = None  # cancel|timeout|stalled|shutdown|lease_lost
        self.ended_noted = False  # the "attempt ended" log line was written
        self.kill_at: float | None = None
        self.last_step: int | None = None  # progress watchdog: the step last seen ...
        self.last_advance = self.started  # ... and when it last moved
        # When the lease was last extended (the claim started it): the supervisor's lease
        # watchdog kills the attempt once this is a whole lease ago.
        self.renewed_at = self.started
        self.pids_seen: set[int] = set()  # every process of the group, for the GPU check
        self.gpu_wait_since: float | None = None
        self._lines: list[tuple[float, str, str]] = []
        self._lock = threading.Lock()
        self._on_exit = on_exit
        self._open_pipes = 2
        self._pumps = [
            threading.Thread(target=self._pump, args=(pipe, name), daemon=True)
            for pipe, name in ((stdout, "stdout"), (stderr, "stderr"))
        ]
        for t in self._pumps:
            t.start()

    @classmethod
    def start(
        cls,
        claim: Claim,
        devices: list[int],
        *,
        accelerator: str,
        threads: int,
        env: dict[str, str],
        zygote: Zygote | None,
        on_exit: Callable[[], None] | None = None,
    ) -> Attempt:
        """Start the job's runner: forked from the warm zygote, or as a fresh interpreter."""
        args = [
            "--job-id", str(claim.fence.job_id),
            "--attempt", str(claim.fence.attempt),
            "--lease-token", claim.fence.lease_token,
            "--accelerator", accelerator,
            "--threads", str(threads),
        ]  # fmt: skip
        env = {
            **env,
            "PYTHONUNBUFFERED": "1",  # lines reach the logs as printed, even on a crash
        }
        if accelerator == "cuda":
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, devices))
        if zygote is None:
            popen = subprocess.Popen(
                [sys.executable, "-m", "workers.runner", *args],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
                start_new_session=True,  # the runner leads its own process group
            )
            assert popen.stdout is not None and popen.stderr is not None
            return cls(claim, devices, popen, popen.stdout, popen.stderr, on_exit)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:
            pid = zygote.spawn("workers.runner", args, env, out_w, err_w)
        finally:
            os.close(out_w)
            os.close(err_w)
        process = ZygoteProcess(zygote, pid)
        return cls(claim, devices, process, open(out_r, "rb"), open(err_r, "rb"), on_exit)  # noqa: SIM115

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
        with self._lock:
            self._open_pipes -= 1
            closed = self._open_pipes == 0
        if closed and self._on_exit is not None:
            self._on_exit()

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
        if self.kill_at is not None:
            deadlines.append(self.kill_at)
        if self.timeout_s is not None and self.stop_reason is None:
            deadlines.append(self.started + self.timeout_s)
        return min(deadlines)

    def finished(self) -> bool:
        """The runner exited and no process of its group remains."""
        return self.proc.poll() is not None and not self.alive()


def kill_leftovers(session_id: int, started_before: float, timeout_s: float) -> int:
    """SIGKILL what is left of an attempt whose supervisor died; returns how many.

    The runner led its own session, and every rank and loader worker stays in it. Linux
    does not reuse an id while a process still uses it as a session id, so the members
    of that session are ours, unless all of them died and the id came back for a new
    session: such processes started after ``started_before`` (Unix seconds: when the
    dead supervisor's lease on the job ran or runs out) and are left alone.
    """
    pids = [
        pid for pid in group_members(session_id)
        if _session_of(pid) == session_id and _start_time(pid) <= started_before
    ]  # fmt: skip
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout_s
    while any(pid in group_members(session_id) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return len(pids)


def stat_fields(pid: int) -> list[str]:
    """Fields of /proc/PID/stat after "pid (comm)": [0] is state, [1] ppid, [2] pgrp,
    [3] session; empty if the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return []
    return stat[stat.rindex(")") + 2 :].split()


def _session_of(pid: int) -> int | None:
    fields = stat_fields(pid)
    return int(fields[3]) if fields else None


def _start_time(pid: int) -> float:
    """When a process started, in Unix seconds (inf if it is gone)."""
    fields = stat_fields(pid)
    if not fields:
        return math.inf
    ticks = int(fields[19])  # field 22 of stat: start time in clock ticks after boot
    return _boot_time() + ticks / os.sysconf("SC_CLK_TCK")


def _boot_time() -> float:
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("btime "):
                return float(line.split()[1])
    raise RuntimeError("no btime in /proc/stat")


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes whose process group is ``pgid``, read from /proc."""
    members = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            fields = stat_fields(int(entry.name))
            if fields and int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
                members.append(int(entry.name))
    return members
