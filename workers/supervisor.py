"""The worker supervisor: one per box. Claims jobs that fit its free devices, starts a
runner per attempt, renews leases, relays logs, and ends every attempt in the store.

The loop waits on "new work, the poll timer, or stop", and never blocks on one job:
kills escalate over ticks (SIGTERM, grace, SIGKILL) while other jobs keep their heartbeats.
"""

from __future__ import annotations

import json
import logging
import math
import os
import platform
import signal
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy.exc import DBAPIError

from service import catalog, store
from service.db import make_engine
from service.models import JobStatus, Worker
from service.settings import Settings
from service.store import Outcome
from service.wakeup import JobListener, can_listen
from workers import devices as device_info
from workers import gpu
from workers.attempt import Attempt, kill_leftovers, outcome_path
from workers.recipes import load_recipes
from workers.zygote import Zygote

log = logging.getLogger(__name__)
T = TypeVar("T")

# Claim latency bound while idle. An idle poll is one indexed read, no write lock.
POLL_INTERVAL_S = 0.05
# The lease watchdog looks at least this often (and at the moment a lease would lapse).
LEASE_WATCHDOG_EVERY_S = 1.0
# With every device busy there is nothing to claim: the loop wakes when a runner's pipes
# close or the zygote reports its exit, at a kill deadline or timeout, and else only this
# often, to store log lines. (Every 50 ms, its wake-ups took a core from the training
# job's threads for a moment, 20 times a second.)
BUSY_WAIT_S = 0.5
# A zygote that died this many times in a row before it was warm, or is not warm after
# this long, is given up: runners then start as fresh interpreters (slower, but they run).
ZYGOTE_MAX_COLD_DEATHS = 3
ZYGOTE_READY_TIMEOUT_S = 120.0
# With LISTEN/NOTIFY (PostgreSQL) an idle worker polls only this often, as a fallback.
NOTIFIED_FALLBACK_POLL_S = 1.0
GPU_SAMPLE_EVERY_S = 5.0  # GPU utilisation and memory, for /metrics
# Lease, heartbeat, kill grace, stall and reservation times are operator settings
# (service/settings.py); the keyword arguments below override them in tests.


class Supervisor:
    """Runs jobs from the queue on this box's devices until stopped (or drained)."""

    def __init__(
        self,
        settings: Settings,
        *,
        worker_id: str | None = None,
        poll_interval_s: float = POLL_INTERVAL_S,
        **overrides: float,
    ) -> None:
        settings = settings.model_copy(update=overrides)
        # CUDA numbers GPUs fastest-first by default, NVML by PCI bus: make them agree,
        # before anything here or in a runner initialises CUDA.
        os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
        self.settings = settings
        self.engine = make_engine(settings)
        self.worker_id = worker_id or settings.worker_id or platform.node()
        self.poll_interval_s = poll_interval_s
        self.heartbeat_interval_s = settings.heartbeat_interval_s
        self.lease_s = settings.lease_s
        self.kill_grace_s = settings.kill_grace_s
        self.attempts: dict[int, Attempt] = {}
        self._wake = threading.Event()
        self._stopping = False
        self._stop_now = False
        self._env = self._runner_env()
        self.zygote: Zygote | None = None
        self._zygote_started = 0.0
        self._zygote_deaths = 0  # in a row, before it was warm
        self._cold_start = False  # the zygote cannot get warm here
        # The zygote first: its imports (torch and the training code, ~2.5 s) then run
        # beside this process's own (torch again, for the devices and recipes, ~1.3 s)
        # rather than after them. (This module imports nothing heavy for that reason.)
        self._warm_zygote()
        self.accelerator, self.devices = device_info.detect(settings.cpu_slots)
        self.recipes = load_recipes(settings.recipes_dir)
        self.gpu_pids = gpu.compute_pids  # replaceable in tests: there is no GPU there
        self.sampled_at = float("-inf")
        self.database_down_since: float | None = None
        self._watchdog_stop = threading.Event()
        # PostgreSQL: a submit wakes this worker at once; polling is only the fallback.
        self.listener = (
            JobListener(self.engine, self._wake.set) if can_listen(self.engine) else None
        )

    # --- public ------------------------------------------------------------------

    def run(self, *, drain: bool = False) -> None:
        """Work until stopped; with ``drain``, until no job it could run is left."""
        self._register()
        self._recover()
        log.info(
            "worker %s: %d %s device(s), recipes %s",
            self.worker_id,
            len(self.devices),
            self.accelerator,
            ", ".join(sorted(self.recipes)),
        )
        next_heartbeat = 0.0
        if self.listener is not None:
            self.listener.start()
        threading.Thread(target=self._lease_watchdog, name="lease-watchdog", daemon=True).start()
        try:
            while True:
                now = time.monotonic()
                if now >= next_heartbeat:
                    next_heartbeat = now + self.heartbeat_interval_s
                    self._while_database_answers(self._heartbeat)
                self._supervise(now)
                self._flush_logs()
                claimed = not self._stopping and bool(self._while_database_answers(self._claim))
                if self._stopping and not self.attempts:
                    break
                idle = drain and not claimed and not self.attempts
                if idle and self._while_database_answers(self._pending) is False:
                    break
                if not claimed:
                    until_heartbeat = max(0.0, next_heartbeat - time.monotonic())
                    self._wake.wait(min(self._idle_wait(), until_heartbeat))
                    self._wake.clear()
        finally:
            self._shutdown()

    def _idle_wait(self) -> float:
        """How long to sleep when nothing was claimed: the poll interval, unless busy, or
        idle and woken by notifications, when only a lost notification waits for the
        fallback."""
        if self.attempts and not self._free_devices():
            if any(a.exiting() for a in self.attempts.values()):
                # Its pipes closed or its runner exited, but not every process is gone
                # or reaped yet (or NVML still lists it): look again soon.
                return self.poll_interval_s
            deadline = min((a.next_deadline() for a in self.attempts.values()), default=math.inf)
            return max(min(BUSY_WAIT_S, deadline - time.monotonic()), self.poll_interval_s)
        if self.listener is None or self.attempts:
            return self.poll_interval_s
        return min(NOTIFIED_FALLBACK_POLL_S, self.heartbeat_interval_s)

    def stop(self, *, now: bool = False) -> None:
        """Stop claiming and hand running jobs back; ``now`` kills them without grace."""
        if self._stopping:
            now = True  # a second request means: do not wait
        self._stopping = True
        self._stop_now = self._stop_now or now
        for attempt in self.attempts.values():
            # SIGTERM asks the job to checkpoint where it is; it resumes there later.
            attempt.request_stop("shutdown", 0.0 if self._stop_now else self.kill_grace_s)
            if self._stop_now:
                attempt.signal(signal.SIGKILL)
        self._wake.set()

    def install_signal_handlers(self) -> None:
        """SIGTERM/SIGINT: graceful stop; a second one: stop now."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.stop())

    # --- the loop's steps ----------------------------------------------------------

    def _register(self) -> None:
        catalog.register_worker(
            self.engine,
            Worker(
                id=self.worker_id,
                hostname=platform.node(),
                pid=os.getpid(),
                accelerator=self.accelerator,
                devices=self.devices,
                recipes=[r.describe() for r in self.recipes.values()],
            ),
        )

    def _recover(self) -> None:
        """Kill what a previous run of this worker left behind and requeue its jobs."""
        for job in store.active_jobs_of(self.engine, self.worker_id):
            if job.runner_pgid is not None and job.lease_expires_at is not None:
                # nothing started after the lease ran out can belong to the attempt
                expiry = job.lease_expires_at.timestamp()
                killed = kill_leftovers(job.runner_pgid, expiry, self.kill_grace_s)
                log.warning("job %s: killed %d process(es) left by a previous run", job.id, killed)
        for job_id in store.abandon_worker_jobs(self.engine, self.worker_id):
            log.warning("job %s: requeued after this worker restarted", job_id)

    def _sample_devices(self) -> list[dict[str, Any]] | None:
        """GPU utilisation and memory for /metrics, every GPU_SAMPLE_EVERY_S (NVML init
        costs milliseconds: not on every heartbeat)."""
        now = time.monotonic()
        if self.accelerator != "cuda" or now - self.sampled_at < GPU_SAMPLE_EVERY_S:
            return None
        self.sampled_at = now
        return gpu.sample(self.devices)

    def _while_database_answers(self, step: Callable[[], T]) -> T | None:
        """Run one step of the loop; if the database is unreachable, say so (once per
        outage) and go on: running jobs continue while their leases last."""
        try:
            result = step()
        except DBAPIError as exc:
            if self.database_down_since is None:
                self.database_down_since = time.monotonic()
                log.error("database unreachable; jobs go on for up to a lease: %s", exc)
            return None
        if self.database_down_since is not None:
            down = time.monotonic() - self.database_down_since
            log.warning("database reachable again after %.1fs", down)
            self.database_down_since = None
        return result

    def _lease_watchdog(self) -> None:
        """Kill every attempt whose lease was not renewed for a whole lease: this worker can
        no longer prove it owns the job (another worker may be given it), so it must not
        train it on. A thread of its own that never touches the database, so a database
        call that hangs (a network partition) cannot delay it."""
        wait = LEASE_WATCHDOG_EVERY_S
        while not self._watchdog_stop.wait(wait):
            now = time.monotonic()
            wait = LEASE_WATCHDOG_EVERY_S
            for job_id, attempt in list(self.attempts.items()):
                lapses_in = attempt.renewed_at + self.lease_s - now
                if lapses_in < 0 and attempt.stop_reason != "lease_lost":
                    self._kill_unowned(job_id, attempt, f"not renewed for {self.lease_s:.0f}s")
                elif lapses_in >= 0:
                    wait = min(wait, lapses_in + 0.001)  # wake just past the moment

    def _kill_unowned(self, job_id: int, attempt: Attempt, why: str) -> None:
        """The job is not (provably) ours any more: its runner must not train on."""
        log.error("job %s: lease lost (%s); killing its runner", job_id, why)
        attempt.stop_reason = "lease_lost"
        attempt.signal(signal.SIGKILL)

    def _heartbeat(self) -> None:
        catalog.worker_heartbeat(self.engine, self.worker_id, self._sample_devices())
        live = {jid: a for jid, a in self.attempts.items() if a.stop_reason != "lease_lost"}
        asked = time.monotonic()
        held = store.renew_lease(self.engine, [a.fence for a in live.values()], self.lease_s)
        now = time.monotonic()
        for job_id, attempt in live.items():
            lease = held.get(job_id)
            if lease is None:  # someone else owns the job now
                self._kill_unowned(job_id, attempt, "refused by the database")
                continue
            attempt.renewed_at = asked  # leases run from when we asked, not when it returned
            if lease.status == JobStatus.cancelling:
                attempt.request_stop("cancel", self.kill_grace_s)
            if lease.step != attempt.last_step:
                attempt.last_step, attempt.last_advance = lease.step, now
            elif now - attempt.last_advance > self.settings.stall_timeout_s:
                attempt.request_stop("stalled", self.kill_grace_s)
        for job_id in store.expire_leases(self.engine):
            log.warning("job %s: its worker's lease expired; requeued", job_id)

    def _supervise(self, now: float) -> None:
        for job_id, attempt in list(self.attempts.items()):
            attempt.enforce(now, self.kill_grace_s)
            if (
                attempt.finished()
                and self._gpus_released(attempt, now)
                and self._while_database_answers(partial(self._finish, attempt))
            ):
                del self.attempts[job_id]  # else: recorded on a later tick

    def _gpus_released(self, attempt: Attempt, now: float) -> bool:
        """On CUDA, the devices go to the next job only once NVML lists no process of this
        one on them (a driver can hold a context a moment past the process's exit)."""
        if self.accelerator != "cuda":
            return True
        holding = (self.gpu_pids(attempt.devices) or set()) & attempt.pids_seen
        if not holding:
            return True
        attempt.gpu_wait_since = attempt.gpu_wait_since or now
        if now - attempt.gpu_wait_since < self.kill_grace_s:
            return False
        log.error(
            "job %s: NVML still lists pids %s on GPUs %s after %.0fs; releasing them anyway",
            attempt.job_id,
            sorted(holding),
            attempt.devices,
            now - attempt.gpu_wait_since,
        )
        return True

    def _claim(self) -> bool:
        zygote = self._warm_zygote()
        if zygote is not None and not zygote.ready():
            # Not yet: the runner would wait seconds for the imports, with the job's lease
            # running and no heartbeat meanwhile. A warm worker may take the job instead;
            # this one is woken when its zygote is ready.
            return False
        free = self._free_devices()
        asked = time.monotonic()  # the lease starts no earlier than this
        claim = store.claim_job(
            self.engine,
            worker_id=self.worker_id,
            free_devices=len(free),
            total_devices=len(self.devices),
            accelerator=self.accelerator,
            recipes=sorted(self.recipes),
            lease_s=self.lease_s,
            reserve_after_s=self.settings.reserve_after_s,
            peek=True,
        )
        if claim is None:
            return False
        fence = claim.fence
        held = free[: claim.devices]
        ddp = claim.strategy == "ddp" or (claim.strategy == "auto" and claim.devices > 1)
        processes = claim.devices if ddp else 1
        threads = device_info.threads_per_process(len(held), len(self.devices), processes)
        attempt = Attempt.start(
            claim,
            held,
            accelerator=self.accelerator,
            threads=threads,
            env=self._env,
            zygote=zygote,
            on_exit=self._wake.set,
        )
        attempt.renewed_at = asked
        self.attempts[fence.job_id] = attempt
        store.record_start(self.engine, attempt.fence, devices=held, pgid=attempt.pgid)
        attempt.note(
            f"attempt {fence.attempt} started on {self.worker_id}, "
            f"{self.accelerator} devices {held}, runner pid {attempt.pgid}"
        )
        log.info("job %s: claimed (attempt %d) on devices %s", fence.job_id, fence.attempt, held)
        return True

    def _warm_zygote(self) -> Zygote | None:
        """The zygote to fork runners from (restarted if it died); None when turned off,
        or when it cannot get warm here: then runners start as fresh interpreters."""
        if not self.settings.warm_start or self._cold_start:
            return None
        now = time.monotonic()
        if self.zygote is not None and self.zygote.alive():
            if self.zygote.ready() or now - self._zygote_started < ZYGOTE_READY_TIMEOUT_S:
                return self.zygote
            self._start_cold(f"zygote not warm after {ZYGOTE_READY_TIMEOUT_S:.0f}s")
            return None
        if self.zygote is not None:
            log.warning("zygote exited with %s; starting a new one", self.zygote.proc.returncode)
            self._zygote_deaths = 0 if self.zygote.ready() else self._zygote_deaths + 1
            if self._zygote_deaths >= ZYGOTE_MAX_COLD_DEATHS:
                self._start_cold(f"zygote died {self._zygote_deaths} times before warm")
                return None
        self.zygote = Zygote(self._env, notify=self._wake.set)
        self._zygote_started = now
        return self.zygote

    def _start_cold(self, why: str) -> None:
        """Give up on the zygote for good: a job must not wait for one that cannot start."""
        log.error("%s; starting runners as fresh interpreters from now on", why)
        if self.zygote is not None:
            self.zygote.close()
            self.zygote = None
        self._cold_start = True
        self._wake.set()

    def _pending(self) -> bool:
        return (
            store.pending_count(
                self.engine,
                max_devices=len(self.devices),
                accelerator=self.accelerator,
                recipes=sorted(self.recipes),
            )
            > 0
        )

    def _free_devices(self) -> list[int]:
        busy = {d for a in self.attempts.values() for d in a.devices}
        return [d["index"] for d in self.devices if d["index"] not in busy]

    def _flush_logs(self) -> None:
        for attempt in self.attempts.values():
            self._write_lines(attempt)

    def _write_lines(self, attempt: Attempt) -> None:
        lines = attempt.take_lines()
        if not lines:
            return
        try:
            store.append_logs(
                self.engine, attempt.fence, lines, max_lines=self.settings.max_log_lines
            )
        except Exception:  # keep them for the next tick rather than lose them
            attempt.put_back(lines)
            if self.database_down_since is None:  # an outage is reported once, elsewhere
                log.exception("job %s: could not store %d log lines", attempt.job_id, len(lines))

    def _finish(self, attempt: Attempt) -> bool:
        """Record how an attempt ended, after its last process and log line are gone."""
        attempt.join_pumps()
        if attempt.stop_reason == "lease_lost":
            return True  # the job is another worker's now; we may not write about it
        outcome = self._outcome(attempt)
        if not attempt.ended_noted:  # a finish retried after a database outage says it once
            attempt.note(f"attempt {attempt.fence.attempt} ended: {outcome.reason_message}")
            attempt.ended_noted = True
        self._write_lines(attempt)
        if outcome.status == JobStatus.queued:  # handed back (shutdown, preempted)
            store.release_attempt(  # no attempt spent
                self.engine, attempt.fence, outcome.reason_code, outcome.reason_message
            )
        else:
            store.finish_attempt(self.engine, attempt.fence, outcome)
        log.info(
            "job %s: attempt %d %s", attempt.job_id, attempt.fence.attempt, outcome.reason_message
        )
        return True

    def _outcome(self, attempt: Attempt) -> Outcome:
        if attempt.stop_reason == "cancel":
            return Outcome(JobStatus.cancelled, "cancelled", "cancelled while running")
        if attempt.stop_reason == "timeout":
            return Outcome(
                JobStatus.failed, "timeout", f"attempt exceeded timeout_s={attempt.timeout_s}"
            )
        if attempt.stop_reason == "stalled":
            return Outcome(
                JobStatus.failed,
                "stalled",
                f"no training step for {self.settings.stall_timeout_s:.0f}s; stopped",
                retryable=True,
            )
        if attempt.stop_reason == "shutdown":
            return Outcome(
                JobStatus.queued,
                "worker_shutdown",
                f"worker {self.worker_id} shut down; the job resumes from its last checkpoint",
            )
        path = outcome_path(self.settings.data_dir, attempt.job_id, attempt.fence.attempt)
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            code = attempt.proc.returncode or 0  # set: finished() saw it exit
            how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exited with {code}"
            return Outcome(
                JobStatus.failed, "runner_died", f"runner {how} before reporting", retryable=True
            )
        if record["ok"]:
            return Outcome(JobStatus.succeeded, "succeeded", "trained", result=record["result"])
        if "preempted" in record:  # someone sent SIGTERM: it checkpointed and stopped
            return Outcome(JobStatus.queued, "preempted", f"preempted: {record['preempted']}")
        error = record["error"]
        ranks = f" ({error['ranks']})" if error.get("ranks") else ""
        return Outcome(
            JobStatus.failed,
            error["code"],
            f"{error['type']}: {error['message']}{ranks}"[:2000],
            error=error,
            retryable=error["retryable"],
        )

    def _shutdown(self) -> None:
        """Leave nothing running: kill what is left, hand its jobs back, say goodbye."""
        if self.listener is not None:
            self.listener.stop()
        self._watchdog_stop.set()
        for attempt in self.attempts.values():
            attempt.request_stop("shutdown", 0.0)
        deadline = time.monotonic() + self.kill_grace_s
        while self.attempts and time.monotonic() < deadline:
            self._supervise(time.monotonic())
            time.sleep(0.05)
        for attempt in self.attempts.values():  # past the grace: nothing may outlive us
            attempt.signal(signal.SIGKILL)
        while self.attempts and time.monotonic() < deadline + self.kill_grace_s:
            self._supervise(time.monotonic())
            time.sleep(0.05)
        self._while_database_answers(partial(catalog.worker_stopped, self.engine, self.worker_id))
        self.engine.dispose()
        if self.zygote is not None:
            self.zygote.close()

    def _runner_env(self) -> dict[str, str]:
        """The runner reads the same settings as this worker (absolute paths: cwd may differ)."""
        env = dict(os.environ)
        env["TRAINYARD_DATABASE_URL"] = self.settings.database_url
        env["TRAINYARD_DATA_DIR"] = str(Path(self.settings.data_dir).resolve())
        env["TRAINYARD_LEASE_S"] = str(self.lease_s)  # the runner gives up after as long
        # torch counts GPUs through NVML then, without initialising CUDA: a runner must
        # not initialise it before forking its ranks.
        env["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
        if self.settings.recipes_dir is not None:
            env["TRAINYARD_RECIPES_DIR"] = str(Path(self.settings.recipes_dir).resolve())
        return env
