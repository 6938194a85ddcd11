"""The worker in front of a Slurm cluster (``trainyard worker --executor slurm``): one per
submit host. It claims jobs from Trainyard's queue (fair share, quotas and sweeps decide
what), submits each attempt as one Slurm batch job (Slurm decides where it runs), and
watches it to its end: Slurm's state and waiting reason, the runners' logs, points and
reports, which reach the database through this process (the job's hold no credential).

It holds each job's lease as a box's worker does, renewed on a thread of its own
(``leases``) while the Slurm job lives, and cancels through ``scancel``. Its jobs outlive
it: stopped or killed, it leaves them running in Slurm, and at its next start adopts the
ones whose lease it still holds (by the comment each batch job carries); a Slurm job of
its own that no attempt it follows owns is cancelled, at start and at every poll. The
contract it shares with a box's supervisor (submit, watch, cancel, adopt) is
docs/architecture.md's, "Executors".
"""

from __future__ import annotations

import logging
import os
import platform
import re
import sys
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import TypeVar

from service import catalog, store
from service.db import make_engine, read_session
from service.models import Accelerator, Job, JobStatus, Worker, utcnow
from service.reasons import ReasonCode
from service.settings import Settings
from service.store import Fence
from service.wakeup import JobListener, can_listen
from workers.jobfiles import JobFiles, write_atomic
from workers.outcome import StopReason
from workers.recipes import Recipe, find_recipes
from workers.slurm import batch, ends, submit
from workers.slurm.attempt import Submitted
from workers.slurm.cluster import Cluster, SlurmError, SlurmJob
from workers.slurm.leases import LeaseKeeper
from workers.slurm.logs import LogTail
from workers.supervisor.reporter import DbReporter, runner_report

log = logging.getLogger(__name__)

T = TypeVar("T")

# A job squeue does not list this many polls in a row has ended (one miss may be a
# controller's hiccup).
MISSING_POLLS = 2
# Claim latency while it may take a job: a box's worker's (an idle poll is one indexed
# read); with LISTEN/NOTIFY, only a fallback.
POLL_INTERVAL_S = 0.05
NOTIFIED_FALLBACK_POLL_S = 1.0
# How often its jobs' output files are read into their logs.
LOGS_EVERY_S = 0.5
# A worker id goes into the batch job's comment and the alive file's name.
WORKER_ID = re.compile(r"[A-Za-z0-9._-]{1,100}")


class SlurmWorker:
    """Runs jobs from the queue on a Slurm cluster until stopped."""

    def __init__(
        self, settings: Settings, *, worker_id: str | None = None, cluster: Cluster | None = None
    ) -> None:
        self.settings = settings
        self.engine = make_engine(settings)
        self.worker_id = worker_id or settings.worker_id or platform.node()
        self.cluster = cluster or Cluster()
        self.attempts: dict[int, Submitted] = {}
        self.recipes: dict[str, Recipe] = {}
        self.accelerator = Accelerator.cuda if settings.slurm_gpus_per_node > 0 else Accelerator.cpu
        # devices a job may ask for on each node: GPUs, or on a CPU partition its CPUs
        # (CPU_SLOTS, else what sinfo says a node has, once the worker starts)
        self.per_node = settings.slurm_gpus_per_node or settings.cpu_slots or 0
        self.python = settings.slurm_python or sys.executable
        # when this worker last renewed its leases, for its batch jobs to read
        alive = settings.data_dir.resolve() / "slurm-workers" / f"{self.worker_id}.alive"
        self._wake = threading.Event()
        self._renewed = threading.Event()
        self.keeper = LeaseKeeper(
            self.engine,
            self.worker_id,
            lambda: list(self.attempts.values()),
            lease_s=settings.lease_s,
            interval_s=settings.heartbeat_interval_s,
            alive_file=alive,
            on_renewed=self._on_renewed,
        )
        # PostgreSQL: a submit wakes this worker at once; polling is only the fallback.
        self.listener = (
            JobListener(self.engine, self._wake.set) if can_listen(self.engine) else None
        )
        self._stopping = False
        self._orphans: set[str] = set()  # Slurm jobs of ours no attempt owns, cancelled
        self._last_poll: float | None = None  # monotonic

    # --- public ------------------------------------------------------------------

    def run(self) -> None:
        """Work until stopped; the jobs in Slurm run on."""
        self._open()
        self.keeper.start()
        if self.listener is not None:
            self.listener.start()
        next_poll = next_charge = next_logs = 0.0
        try:
            while not self._stopping:
                now = time.monotonic()
                if now >= next_poll:
                    next_poll = now + self.settings.slurm_poll_interval_s
                    self._guarded(self._poll)
                if now >= next_charge:
                    next_charge = now + self.settings.heartbeat_interval_s
                    self._guarded(self._charge)
                if now >= next_logs:
                    next_logs = now + LOGS_EVERY_S
                    self._guarded(self._flush_logs)
                if self._renewed.is_set():  # what the renewal says: cancel, stall
                    self._renewed.clear()
                    self._guarded(self._act)
                if not self._guarded(self._claim):
                    wake_at = min(next_poll, next_charge, next_logs, now + self._claim_wait())
                    self._wake.wait(max(0.0, wake_at - time.monotonic()))
                    self._wake.clear()
        finally:
            if self.listener is not None:
                self.listener.stop()
            self.keeper.stop()
            self._close()

    def _on_renewed(self) -> None:
        """From the lease keeper's thread: its renewal is in ``Submitted.held``."""
        self._renewed.set()
        self._wake.set()

    def _claim_wait(self) -> float:
        """How soon to look for a job again: as a box's worker does (every 50 ms, or woken
        by a submit's NOTIFY on PostgreSQL), unless SLURM_MAX_PENDING of its jobs wait in
        Slurm already."""
        if self._pending() >= self.settings.slurm_max_pending:
            return LOGS_EVERY_S
        return NOTIFIED_FALLBACK_POLL_S if self.listener is not None else POLL_INTERVAL_S

    def _pending(self) -> int:
        return sum(1 for a in self.attempts.values() if a.running_since is None)

    def stop(self) -> None:
        """Stop claiming and watching; jobs in Slurm run on, adopted at the next start."""
        self._stopping = True
        self._wake.set()

    def install_signal_handlers(self) -> None:
        import signal

        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.stop())

    # --- start and end -----------------------------------------------------------

    def _open(self) -> None:
        if not WORKER_ID.fullmatch(self.worker_id):
            raise SystemExit(
                f"worker id {self.worker_id!r}: a Slurm worker's id is letters, digits, "
                "'.', '_' and '-' (it names its batch jobs' comment); set --worker-id"
            )
        if any(c.isspace() for c in str(self.settings.data_dir.resolve())):
            raise SystemExit(
                f"DATA_DIR {self.settings.data_dir} has a space: Slurm's #SBATCH lines "
                "cannot name its files"
            )
        self._refuse_a_box_of_the_same_id()
        if os.geteuid() == 0:
            log.warning(
                "the Slurm worker runs as root: Slurm runs each job as the account that "
                "submits it, so its jobs run as root; run it as a service account"
            )
        if self.per_node == 0:
            self.per_node = self.cluster.cpus_per_node(self.settings.slurm_partition)
        found = find_recipes(self.settings.recipes_dir)
        self.recipes = found.recipes
        self.keeper.alive_file.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(self.keeper.alive_file, f"{time.time():.0f}\n")
        self._adopt()
        catalog.register_worker(
            self.engine,
            Worker(
                id=self.worker_id,
                hostname=platform.node(),
                pid=os.getpid(),
                accelerator=self.accelerator,
                devices=[
                    {"index": i, "name": f"slurm {self.accelerator}", "memory_mb": 0}
                    for i in range(self.per_node)
                ],
                recipes=[r.describe() for r in self.recipes.values()],
                recipe_errors=[{"source": s.source, "error": s.error} for s in found.skipped],
                across_boxes=True,
                executor="slurm",
                max_nodes=self.settings.slurm_max_nodes,
                job_walls={"runs_jobs_as": "the Slurm worker's account, through Slurm"},
            ),
        )
        log.info(
            "Slurm worker %s: up to %d node(s) of %d %s device(s), recipes %s",
            self.worker_id,
            self.settings.slurm_max_nodes,
            self.per_node,
            self.accelerator,
            ", ".join(sorted(self.recipes)),
        )

    def _refuse_a_box_of_the_same_id(self) -> None:
        """Both kinds default to the host's name: a box's worker of that id, alive, would
        take this one's jobs for its own (and requeue them at its next start)."""
        with read_session(self.engine) as session:
            row = session.get(Worker, self.worker_id)
        if row is None or row.executor == "slurm" or row.stopped_at is not None:
            return
        if (utcnow() - row.heartbeat_at).total_seconds() < catalog.WORKER_ALIVE_S:
            raise SystemExit(
                f"a box's worker named {self.worker_id!r} is running: give the Slurm "
                "worker another --worker-id"
            )

    def _close(self) -> None:
        for attempt in self.attempts.values():
            attempt.close_reporters()
        try:
            catalog.worker_stopped(self.engine, self.worker_id)
        except Exception:
            log.exception("could not mark worker %s stopped", self.worker_id)
        self.engine.dispose()

    def _adopt(self) -> None:
        """Take back the attempts this worker held when it stopped, and cancel any Slurm
        job it submitted that no held attempt owns (its lease ran out meanwhile)."""
        for job_id in store.expire_leases(self.engine):
            log.warning("job %s: its worker's lease expired; requeued", job_id)
        held = {j.id: j for j in store.active_jobs_of(self.engine, self.worker_id)}
        in_slurm = self.cluster.jobs()
        by_attempt: dict[tuple[int, int], SlurmJob] = {}
        for listed in in_slurm.values():
            said = batch.parse_comment(listed.comment)
            if said is None or said[0] != self.worker_id:
                continue
            job = held.get(said[1])
            if job is not None and job.attempt == said[2]:
                by_attempt[said[1], said[2]] = listed
        now = time.monotonic()
        for job in held.values():
            assert job.id is not None and job.lease_token is not None
            attempt = self._watch(job, Fence(job.id, job.attempt, job.lease_token))
            seen = by_attempt.get((job.id, job.attempt))
            attempt.slurm_id = seen.id if seen is not None else job.executor_id
            for tail in attempt.logs:  # on from what the last run stored: no line twice
                tail.resume()
            if seen is not None and seen.running:  # its timeout counts Slurm's time
                attempt.running_since = now - seen.used_s
                attempt.charged_until = now
                self._report_points(attempt)
            self._note(attempt, f"adopted by {self.worker_id} after a restart (Slurm job "
                                f"{attempt.slurm_id or 'never submitted'})")  # fmt: skip
            if job.status == JobStatus.cancelling:  # the scancel may not have been sent
                self._stop(attempt, StopReason.cancel)
            log.info("job %s: adopted (Slurm job %s)", job.id, attempt.slurm_id)
        self._cancel_orphans(in_slurm)

    # --- the loop's steps ----------------------------------------------------------

    def _guarded(self, step: Callable[[], T]) -> T | None:
        """One step; a database or Slurm failure is logged and tried again next time."""
        try:
            return step()
        except (SlurmError, OSError) as exc:
            log.warning("%s", exc)
        except Exception:
            log.exception("Slurm worker step failed")
        return None

    def _each(self, what: str, act: Callable[[Submitted], object]) -> None:
        """``act`` on every attempt; one that fails (its scancel, its write) is logged and
        tried again next time, and the others go on."""
        for attempt in list(self.attempts.values()):
            try:
                act(attempt)
            except Exception as exc:
                log.warning("job %s: %s failed: %s", attempt.job.id, what, exc)

    def _act(self) -> None:
        """What the lease keeper's last renewal asks (cancel, stall), stops not yet sent."""
        self._each("acting on its lease", self._act_on)

    def _act_on(self, attempt: Submitted) -> None:
        held = attempt.held
        if attempt.lost or held is None:
            return
        if held.status == JobStatus.cancelling:
            self._stop(attempt, StopReason.cancel)
        elif self._stalled(attempt, held.step, time.monotonic()):
            self._stop(attempt, StopReason.stalled)
        if attempt.stop is not None and not attempt.stop_sent:
            self._send_stop(attempt)

    def _stalled(self, attempt: Submitted, step: int | None, now: float) -> bool:
        """No training step for STALL_TIMEOUT_S while Slurm runs it (a script that has
        reported no step yet is not judged: it may never report one)."""
        if attempt.running_since is None or (step is None and attempt.job.entrypoint):
            return False
        if step != attempt.last_step or attempt.last_advance is None:
            attempt.last_step, attempt.last_advance = step, now
        return now - attempt.last_advance > self.settings.stall_timeout_s

    def _charge(self) -> None:
        """Fair share: the device-seconds of the attempts Slurm runs."""
        now = time.monotonic()
        charges: dict[str, float] = {}
        for attempt in self.attempts.values():
            if attempt.charged_until is not None:
                owner = attempt.job.owner
                charges[owner] = charges.get(owner, 0.0) + attempt.uncharged(now)
        if charges:
            store.charge_usage(self.engine, charges, utcnow(), self.settings.fair_share_half_life_s)
            for attempt in self.attempts.values():
                if attempt.charged_until is not None:
                    attempt.charged_until = now

    def _poll(self) -> None:
        """Ask Slurm about every attempt at once; act on what changed."""
        if not self.attempts and not self._orphans:
            return
        in_slurm = self.cluster.jobs()
        now = time.monotonic()
        for job_id, attempt in list(self.attempts.items()):
            if attempt.lost:  # the lease keeper (or a reporter) gave it up
                attempt.close_reporters()
                del self.attempts[job_id]
                continue
            try:
                if self._follow(attempt, in_slurm.get(attempt.slurm_id or ""), now):
                    del self.attempts[job_id]
            except Exception as exc:  # its write or its scancel: next poll
                log.warning("job %s: %s", job_id, exc)
        self._cancel_orphans(in_slurm)
        self._last_poll = now

    def _follow(self, attempt: Submitted, seen: SlurmJob | None, now: float) -> bool:
        """One attempt as Slurm sees it now; True once its end is recorded."""
        if seen is None:
            attempt.missing += 1
            if attempt.slurm_id is not None and attempt.missing < MISSING_POLLS:
                return False
            if attempt.slurm_id is not None:  # gone or forgotten: never left behind
                self.cluster.cancel(attempt.slurm_id)
            return self._finish(attempt, None)
        attempt.missing = 0
        if seen.ended:
            return self._finish(attempt, seen)
        if seen.waiting:
            self._waiting(attempt, seen)
        elif attempt.running_since is None:
            attempt.running_since = now - seen.used_s
            attempt.charged_until = now
            self._report_points(attempt)
            self._note(attempt, f"Slurm job {seen.id} running on {seen.nodes}")
            store.record_executor(
                self.engine,
                attempt.fence,
                reason=(ReasonCode.running, f"running in Slurm job {seen.id} on {seen.nodes}"),
            )
        elif seen.paused and self._last_poll is not None:
            # Suspended by Slurm: neither its timeout, nor the stall watch, nor fair
            # share count the pause.
            attempt.running_since += now - self._last_poll
            attempt.last_advance = now
            attempt.charged_until = now
        self._enforce(attempt, now)
        return False

    def _waiting(self, attempt: Submitted, seen: SlurmJob) -> None:
        """A job pending in Slurm shows Slurm's reason as its own."""
        if seen.reason == attempt.reason:
            return
        why = "" if seen.reason in ("None", "") else f": {seen.reason}"
        store.record_executor(
            self.engine,
            attempt.fence,
            reason=(ReasonCode.slurm_pending, f"pending in Slurm job {seen.id}{why}"),
        )
        attempt.reason = seen.reason

    def _enforce(self, attempt: Submitted, now: float) -> None:
        """Trainyard's own timeout, counted from when Slurm started the job (Slurm's
        --time is a backstop past it)."""
        timeout_s = attempt.job.timeout_s
        started = attempt.running_since
        if timeout_s is not None and started is not None and now - started > timeout_s:
            self._stop(attempt, StopReason.timeout)

    def _stop(self, attempt: Submitted, reason: StopReason) -> None:
        """Stop the attempt for ``reason`` (the first stands); its end is recorded once
        Slurm says its job ended."""
        if attempt.stop is not None:
            return
        attempt.stop = reason
        log.info("job %s: stopping Slurm job %s (%s)", attempt.job.id, attempt.slurm_id, reason)
        self._send_stop(attempt)

    def _send_stop(self, attempt: Submitted) -> None:
        """scancel: Slurm sends its processes SIGTERM (they checkpoint), then SIGKILL after
        the cluster's KillWait. Sent once; a failed one is sent again next tick."""
        if attempt.slurm_id is not None:
            self.cluster.cancel(attempt.slurm_id)
        attempt.stop_sent = True

    def _cancel_orphans(self, in_slurm: dict[str, SlurmJob]) -> None:
        """Cancel every Slurm job this worker submitted that no attempt it follows owns: a
        lease that lapsed while it was down, an sbatch that timed out yet queued the job.
        Nothing of an attempt that is not this worker's may run in a job's folder."""
        ours = {(a.fence.job_id, a.fence.attempt): a.slurm_id for a in self.attempts.values()}
        orphans = set()
        for listed in in_slurm.values():
            said = batch.parse_comment(listed.comment)
            if said is None or said[0] != self.worker_id or listed.ended:
                continue
            if ours.get((said[1], said[2])) == listed.id:
                continue
            orphans.add(listed.id)
            if listed.id not in self._orphans:
                log.warning("Slurm job %s: no attempt of ours owns it; cancelling", listed.id)
                self.cluster.cancel(listed.id)
        self._orphans = orphans

    def _claim(self) -> bool:
        """Claim a job and submit it, while fewer than SLURM_MAX_PENDING wait in Slurm."""
        if self._stopping:
            return False
        if self._pending() >= self.settings.slurm_max_pending:
            return False
        claim = store.claim_job(
            self.engine,
            worker_id=self.worker_id,
            free_devices=self.per_node,
            total_devices=self.per_node,
            accelerator=self.accelerator,
            recipes=sorted(self.recipes),
            lease_s=self.settings.lease_s,
            max_running_devices=self.settings.max_running_devices_per_user,
            peek=True,
            max_nodes=self.settings.slurm_max_nodes,
        )
        if claim is None:
            return False
        job = store.load_job(self.engine, claim.fence.job_id)
        attempt = self._watch(job, claim.fence)  # the lease keeper renews it from now
        try:
            script = submit.write_attempt(
                self.settings,
                attempt,
                worker_id=self.worker_id,
                alive=self.keeper.alive_file,
                python=self.python,
                accelerator=self.accelerator,
            )
            attempt.slurm_id = self.cluster.submit(script, submit.job_env())
        except Exception as exc:  # refused, or the controller is down: retried later
            log.warning("job %s: sbatch failed: %s", job.id, exc)
            self._note(attempt, f"sbatch failed: {exc}")
            self._flush(attempt)
            refused = store.Outcome(
                JobStatus.failed,
                ReasonCode.error,
                f"Slurm did not take the job: {exc}",
                retryable=True,  # within max_attempts: a controller restarting, say
                own=False,
            )
            store.finish_attempt(self.engine, claim.fence, refused)
            # (had sbatch queued it all the same, the next poll cancels it: no attempt owns it)
            self.attempts.pop(claim.fence.job_id, None)
            return True
        store.record_executor(
            self.engine,
            claim.fence,
            executor_id=attempt.slurm_id,
            reason=(ReasonCode.slurm_pending, f"submitted as Slurm job {attempt.slurm_id}"),
        )
        self._note(
            attempt,
            f"attempt {claim.fence.attempt} submitted to Slurm by {self.worker_id}: Slurm job "
            f"{attempt.slurm_id}, {job.nodes} node(s) x {job.devices} {self.accelerator}",
        )
        log.info("job %s: submitted as Slurm job %s", job.id, attempt.slurm_id)
        return True

    def _watch(self, job: Job, fence: Fence) -> Submitted:
        """Follow an attempt, from now on renewed by the lease keeper."""
        assert job.id is not None
        data_dir = self.settings.data_dir
        nodes = [None] if job.nodes == 1 else list(range(job.nodes))
        files = [JobFiles.of(data_dir, job.id, n) for n in nodes]
        runner = files[0].root / ".runner"
        logs = [
            LogTail(files[0].root, runner / f"attempt-{fence.attempt}-slurm.{name}", stream)
            for name, stream in (("out", "stdout"), ("err", "stderr"))
        ]
        attempt = Submitted(job, fence, files, logs, cancel=self.cluster.cancel)
        self.attempts[job.id] = attempt
        return attempt

    def _report_points(self, attempt: Submitted) -> None:
        """Store what its rank 0 writes, per node: from when Slurm runs it (a reporter is
        a thread that looks every 0.5 s; hundreds of pending jobs would each have one for
        nothing), or at its end (it may have run between two polls)."""
        if attempt.reporters or attempt.lost:
            return
        for files in attempt.files:
            attempt.reporters.append(
                DbReporter.of_attempt(
                    self.engine,
                    attempt.fence,
                    files,
                    # from the reporter's thread: marks it lost and cancels its Slurm job;
                    # the loop closes the reporters
                    on_lease_lost=partial(attempt.lose, "the store refused its points"),
                    lease_s=self.settings.lease_s,
                ).start()
            )

    def _finish(self, attempt: Submitted, seen: SlurmJob | None) -> bool:
        """Record how an attempt ended, once Slurm says its job ended (or forgot it)."""
        if attempt.lost:
            attempt.close_reporters()
            return True
        self._flush(attempt, final=True)
        self._report_points(attempt)  # what it wrote, had it run between two polls
        attempt.close_reporters()  # its last points stored before its end is
        self._charge()
        reports = [r for r in (runner_report(f, attempt.fence.attempt) for f in attempt.files) if r]
        exit_code = None
        if seen is not None and not reports:
            exit_code = self.cluster.exit_code(seen.id)
        outcome = ends.outcome(
            attempt.slurm_id or "(never submitted)",
            seen,
            reports,
            attempt.stop,
            exit_code=exit_code,
            timeout_s=attempt.job.timeout_s,
            stall_timeout_s=self.settings.stall_timeout_s,
            worker_id=self.worker_id,
        )
        self._note(attempt, f"attempt {attempt.fence.attempt} ended: "
                            f"{outcome.reason_message.partition(chr(10))[0]}")  # fmt: skip
        self._flush(attempt)
        if outcome.status == JobStatus.queued:
            store.release_attempt(
                self.engine, attempt.fence, outcome.reason_code, outcome.reason_message
            )
        else:
            store.finish_attempt(self.engine, attempt.fence, outcome)
        log.info("job %s: %s", attempt.fence.job_id, outcome.reason_message)
        return True

    # --- logs --------------------------------------------------------------------

    def _note(self, attempt: Submitted, text: str) -> None:
        attempt.logs[0].note(text)

    def _flush_logs(self) -> None:
        self._each("storing its log lines", self._flush)

    def _flush(self, attempt: Submitted, *, final: bool = False) -> None:
        """Store its new log lines: the worker's notes, and once Slurm runs it (or it
        ended), its output files' (a pending job has none yet)."""
        if attempt.lost:
            return
        files = final or attempt.running_since is not None
        lines = [line for tail in attempt.logs for line in tail.read(final=final, files=files)]
        if not lines:
            return
        lines.sort(key=lambda line: line[0])
        try:
            limit = self.settings.max_log_lines
            store.append_logs(self.engine, attempt.fence, lines, max_lines=limit)
        except Exception:
            for i, tail in enumerate(attempt.logs):  # the worker's notes are the first's
                ours = (tail.stream, "system") if i == 0 else (tail.stream,)
                tail.put_back([line for line in lines if line[1] in ours])
            raise
        for tail in attempt.logs:
            tail.stored()
