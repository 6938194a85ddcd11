"""The worker supervisor: one per box. Claims jobs that fit its free devices, starts a
runner per attempt, relays logs, and ends every attempt in the store.

The loop waits on "new work, the poll timer, or stop", and never blocks on one job:
kills escalate over ticks (SIGTERM, grace, SIGKILL) while other jobs keep their heartbeats.
How runners start is ``launch``'s; the leases are ``lease``'s; how an attempt ended is
``workers.outcome.decide``'s; an attempt's own state is ``attempt``'s; the devices are
``devices.Box``'s; rank 0's points reach the store through ``reporter``. What stays here is the
loop and each of its steps (register, heartbeat and usage charge, supervise, claim, relay
logs, finish, shut down), kept together past the ~300 lines other modules keep so that one reading
shows the whole order of a tick.
"""

from __future__ import annotations

import logging
import math
import os
import platform
import signal
import threading
import time
from functools import partial
from typing import Any

from service import catalog, jobspec, store
from service.db import make_engine
from service.models import Accelerator, Job, JobStatus, Worker, utcnow
from service.objects.store import ObjectStore, StoreError
from service.reasons import ReasonCode
from service.settings import Settings
from service.wakeup import JobListener, can_listen
from workers.jobfiles import CHECKPOINTS, JobFiles
from workers.outcome import RunnerReport, StopReason, decide
from workers.recipes import Recipe, SkippedSource, find_recipes
from workers.supervisor import gpu_share
from workers.supervisor.attempt import Attempt
from workers.supervisor.cache_budget import CacheBudget
from workers.supervisor.checkpoint_sync import CheckpointSync
from workers.supervisor.devices import Box
from workers.supervisor.gangs import Gangs, Start
from workers.supervisor.launch import Launcher
from workers.supervisor.lease import Leases
from workers.supervisor.outage import DatabaseWatch
from workers.supervisor.preemptor import Preemptor
from workers.supervisor.reporter import DbReporter, runner_report
from workers.supervisor.uploads import EndUploads
from workers.supervisor.walls import Walls

log = logging.getLogger(__name__)

# Claim latency bound while idle. An idle poll is one indexed read, no write lock.
POLL_INTERVAL_S = 0.05
# With every device busy there is nothing to claim: the loop wakes when a runner's pipes
# close or the zygote reports its exit, at a kill deadline or timeout, and else only this
# often, to store log lines. (Every 50 ms, its wake-ups took a core from the training
# job's threads for a moment, 20 times a second.)
BUSY_WAIT_S = 0.5
# With LISTEN/NOTIFY (PostgreSQL) an idle worker polls only this often, as a fallback.
NOTIFIED_FALLBACK_POLL_S = 1.0
# Lease, heartbeat, kill grace, stall and reservation times are operator settings
# (service/settings.py); the keyword arguments below override them in tests.


def with_overrides(settings: Settings, overrides: dict[str, Any]) -> Settings:
    """``settings`` with some fields replaced, validated as if read from the environment
    (a bad value raises); an unknown name raises TypeError naming it."""
    unknown = sorted(set(overrides) - set(Settings.model_fields))
    if unknown:
        raise TypeError(f"unknown setting(s) for Supervisor: {', '.join(unknown)}")
    if not overrides:
        return settings
    return Settings.model_validate({**settings.model_dump(), **overrides})


class Supervisor:
    """Runs jobs from the queue on this box's devices until stopped (or drained).

    Building one starts nothing: ``run`` starts the zygote, detects the devices and
    loads the recipes."""

    def __init__(
        self,
        settings: Settings,
        *,
        worker_id: str | None = None,
        poll_interval_s: float = POLL_INTERVAL_S,
        **overrides: Any,
    ) -> None:
        """``overrides`` replace settings by name (``kill_grace_s=5``), validated."""
        settings = with_overrides(settings, overrides)
        self.settings = settings
        self.engine = make_engine(settings)  # connects on first use, not here
        self.worker_id = worker_id or settings.worker_id or platform.node()
        self.poll_interval_s = poll_interval_s
        self.attempts: dict[int, Attempt] = {}
        self.checkpoints: dict[int, CheckpointSync] = {}  # by job, with the store only
        self.uploads: dict[int, EndUploads] = {}  # by job: an ended attempt's last uploads
        self._wake = threading.Event()
        self._stopping = False
        self._stop_now = False
        self.launcher = Launcher(settings, notify=self._wake.set)
        self.cache = CacheBudget(settings)  # its size, holds and evictions; the disk's room
        self.leases = Leases(
            self.engine,
            self.attempts,
            lease_s=settings.lease_s,
            kill_grace_s=settings.kill_grace_s,
            stall_timeout_s=settings.stall_timeout_s,
        )
        # Known once run() has detected them.
        self.box = Box(Accelerator.cpu, [])
        self.walls = Walls(None, False, "")
        self.recipes: dict[str, Recipe] = {}
        self.skipped_recipes: list[SkippedSource] = []  # published, so users see why
        self.database = DatabaseWatch()
        self.preemptor = Preemptor(self.engine, settings)
        self.gangs = Gangs(self.engine, settings, self.worker_id)  # jobs across boxes
        # Checkpoints and artifacts where every box reaches them (None: DATA_DIR only).
        self.objects = ObjectStore(settings.storage_url) if settings.storage_url else None
        self.launcher.objects = self.objects  # blobs too: fetched from there first
        # PostgreSQL: a submit wakes this worker at once; polling is only the fallback.
        self.listener = (
            JobListener(self.engine, self._wake.set) if can_listen(self.engine) else None
        )

    # --- public ------------------------------------------------------------------

    def run(self, *, drain: bool = False) -> None:
        """Work until stopped; with ``drain``, until no job it could run is left."""
        try:
            self._open()
            # Recover first: once registered, a worker is seen as up (tests and operators
            # wait for that), so what its last run left is settled by then.
            self.leases.recover(self.worker_id)
            self.cache.upkeep()  # its record, in the registration, says whether it takes jobs
            self._register()
        except BaseException:
            self.launcher.close()  # the zygote must not outlive a worker that never started
            self.engine.dispose()
            raise
        log.info(
            "worker %s: %d %s device(s), recipes %s",
            self.worker_id,
            len(self.box.devices),
            self.box.accelerator,
            ", ".join(sorted(self.recipes)),
        )
        next_heartbeat = 0.0
        if self.listener is not None:
            self.listener.start()
        self.leases.start_watchdog()
        try:
            while True:
                now = time.monotonic()
                if now >= next_heartbeat:
                    next_heartbeat = now + self.settings.heartbeat_interval_s
                    self.database.call(self._heartbeat)
                self._supervise(now)
                self._flush_logs()
                if self._stopping and self.gangs.waiting is not None:
                    self.database.call(self.gangs.leave_all)  # not a node that never runs
                claimed = not self._stopping and bool(self.database.call(self._claim))
                if not claimed and not self._stopping and self.attempts:
                    self.database.call(self._preempt)
                if self._stopping and not self.attempts:
                    break
                idle = drain and not claimed and not self.attempts
                if idle and self.database.call(self._pending) is False:
                    break
                if not claimed:
                    until_heartbeat = max(0.0, next_heartbeat - time.monotonic())
                    self._wake.wait(min(self._idle_wait(), until_heartbeat))
                    self._wake.clear()
        finally:
            self._shutdown()

    def _open(self) -> None:
        """What the constructor leaves to ``run``: the zygote, the devices, the recipes."""
        # CUDA numbers GPUs fastest-first by default, NVML by PCI bus: make them agree,
        # before anything here or in a runner initialises CUDA.
        os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
        # The zygote first: its imports (torch and the training code, ~2.5 s) then run
        # beside this process's own (torch again, for the devices and recipes, ~1.3 s)
        # rather than after them. (This module imports nothing heavy for that reason.)
        self.launcher.open()
        self.walls = Walls.at_start(self.settings)
        self.box = Box.detect(self.settings.cpu_slots, self.settings.job_memory_fraction)
        self.gangs.check_address()
        if self.objects is not None:  # said at start, not first when a job's upload fails
            try:
                self.objects.check()
            except StoreError as exc:
                log.warning(
                    "%s: %s; checkpoints wait on this disk until it answers", self.objects, exc
                )
        found = find_recipes(self.settings.recipes_dir)
        self.recipes, self.skipped_recipes = found.recipes, found.skipped

    def _idle_wait(self) -> float:
        """How long to sleep when nothing was claimed: the poll interval, unless busy, or
        idle and woken by notifications, when only a lost notification waits for the
        fallback."""
        if self.attempts and not self._room_left():
            if any(a.exiting() for a in self.attempts.values()):
                # Its pipes closed or its runner exited, but not every process is gone
                # or reaped yet (or NVML still lists it): look again soon.
                return self.poll_interval_s
            deadline = min((a.next_deadline() for a in self.attempts.values()), default=math.inf)
            return max(min(BUSY_WAIT_S, deadline - time.monotonic()), self.poll_interval_s)
        if self.listener is None or self.attempts or self.gangs.waiting is not None:
            return self.poll_interval_s  # (a gang's start is seen by polling, not notified)
        return min(NOTIFIED_FALLBACK_POLL_S, self.settings.heartbeat_interval_s)

    def stop(self, *, now: bool = False) -> None:
        """Stop claiming and hand running jobs back; ``now`` kills them without grace."""
        if self._stopping:
            now = True  # a second request means: do not wait
        self._stopping = True
        self._stop_now = self._stop_now or now
        grace_s = 0.0 if self._stop_now else self.settings.kill_grace_s
        for attempt in list(self.attempts.values()):  # may run beside the loop (a signal)
            # SIGTERM asks the job to checkpoint where it is; it resumes there later.
            attempt.request_stop(StopReason.shutdown, grace_s)
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
                accelerator=self.box.accelerator,
                devices=self.box.devices,
                recipes=[r.describe() for r in self.recipes.values()],
                recipe_errors=[
                    {"source": s.source, "error": s.error} for s in self.skipped_recipes
                ],
                across_boxes=self.gangs.enabled,
                job_walls=self.walls.published(),
                cache=self.cache.record(),
            ),
        )

    def _heartbeat(self) -> None:
        jobs_by_pid = {p: a.job_id for a in self.attempts.values() for p in a.pids_seen}
        catalog.worker_heartbeat(
            self.engine, self.worker_id, self.box.sample(jobs_by_pid), self.cache.record()
        )
        self.leases.renew()
        if self.gangs.enabled:
            self._renew_nodes()
        self._charge(list(self.attempts.values()))

    def _renew_nodes(self) -> None:
        """This worker's nodes of jobs across boxes are alive; a job one of whose other
        nodes went silent is stopped here too (its ranks would wait on the lost one)."""
        nodes = [job_id for job_id, a in self.attempts.items() if a.node is not None]
        waiting = [] if self.gangs.waiting is None else [self.gangs.waiting.job_id]
        store.gang.renew_nodes(self.engine, self.worker_id, nodes + waiting)
        for job_id, lost in store.gang.lost_nodes(
            self.engine, nodes, self.settings.lease_s
        ).items():
            who = ", ".join(f"node {m.node} (worker {m.worker_id})" for m in lost)
            attempt = self.attempts[job_id]
            attempt.lost_node = who
            # No grace: its ranks may be waiting on the lost node in a collective, which
            # would hold them until its timeout; the last checkpoint is whole (atomic).
            attempt.request_stop(StopReason.node_lost, 0.0)

    def _charge(self, attempts: list[Attempt]) -> None:
        """Charge the attempts' owners the device-seconds since the last charge (fair
        share), in one write; a failed one is charged in full next time."""
        if not attempts:
            return
        now = time.monotonic()
        charges: dict[str, float] = {}
        for attempt in attempts:
            charges[attempt.owner] = charges.get(attempt.owner, 0.0) + attempt.uncharged(now)
        half_life_s = self.settings.fair_share_half_life_s
        store.charge_usage(self.engine, charges, utcnow(), half_life_s)
        for attempt in attempts:
            attempt.charged_until = now

    def _supervise(self, now: float) -> None:
        for job_id, attempt in list(self.attempts.items()):
            attempt.enforce(now, self.settings.kill_grace_s)
            if (
                attempt.finished()
                and self.box.released(attempt, now, self.settings.kill_grace_s)
                and self._uploaded(attempt)
                and self.database.call(partial(self._finish, attempt))
            ):
                del self.attempts[job_id]  # else: recorded on a later tick
                self.checkpoints.pop(job_id, None)
                self.uploads.pop(job_id, None)
                if attempt.cache_holds is not None:  # its cache entries may be evicted now
                    attempt.cache_holds.release()

    def _uploaded(self, attempt: Attempt) -> bool:
        """Whether what an ended attempt left is in the object store, or given up on (the
        uploads start in a thread the first time this is asked)."""
        sync = self.checkpoints.get(attempt.job_id)
        if sync is None:
            return True
        if attempt.stop_reason == StopReason.lease_lost:
            sync.close()  # the job is another worker's now: nothing more of ours goes up
            return True
        uploads = self.uploads.get(attempt.job_id)
        if uploads is None:
            files = JobFiles.of(self.settings.data_dir, attempt.job_id, attempt.node)
            report = runner_report(files, attempt.fence.attempt)
            leader = attempt.node is None or (report is not None and report.leader)
            # The artifacts of an attempt that hands its job back are not its last word
            ended = self._decide(attempt, attempt.stop_reason, report).status != JobStatus.queued
            uploads = self.uploads[attempt.job_id] = EndUploads(
                sync,
                artifacts=leader and ended,
                timeout_s=self.settings.storage_flush_s,
                note=attempt.note,
                on_done=self._wake.set,
            )
        return uploads.done.is_set()

    def _uids_in_use(self) -> set[int]:
        """The uids this worker's running attempts have (TRAINYARD_JOB_UIDS)."""
        return {a.account.uid for a in self.attempts.values() if a.account is not None}

    def _claim(self) -> bool:
        if self.cache.upkeep() is not None:
            return False  # the disk is nearly full: said in the log and the worker's record
        if not self.walls.room(self._uids_in_use()):
            return False  # every uid of the range runs an attempt: none starts meanwhile
        if not self.launcher.ready():
            # Not yet: the runner would wait seconds for the imports, with the job's lease
            # running and no heartbeat meanwhile. A warm worker may take the job instead;
            # this one is woken when its zygote is ready.
            return False
        if self.gangs.enabled:  # jobs across boxes first: their gangs hold devices
            start = self.gangs.step(
                self.box.offer(self._holdings()).whole,
                len(self.box.devices),
                self.box.accelerator,
                sorted(self.recipes),
                running=set(self.attempts),  # a node of its last attempt may be ending
            )
            if start is not None:
                self._start_node(start)
                return True
            if self.gangs.reserving:
                return False  # the devices this job waits for are not handed out meanwhile
        offer = self.box.offer(self._holdings())
        asked = time.monotonic()  # the lease starts no earlier than this
        claim = store.claim_job(
            self.engine,
            worker_id=self.worker_id,
            free_devices=len(offer.whole),
            total_devices=len(self.box.devices),
            gpu_room_gb=offer.largest_room_gb,
            gpu_total_gb=self.box.largest_share_gb(),
            accelerator=self.box.accelerator,
            recipes=sorted(self.recipes),
            lease_s=self.settings.lease_s,
            reserve_after_s=self.settings.reserve_after_s,
            max_running_devices=self.settings.max_running_devices_per_user,
            peek=True,
        )
        if claim is None:
            return False
        fence = claim.fence
        share = None  # the part of its GPU a job asking for a share may allocate
        if claim.gpu_memory_gb is None:
            held = offer.whole[: claim.devices]
        else:  # it fits one of the rooms: the claim was offered the largest
            device = gpu_share.place(offer.rooms, claim.gpu_memory_gb)
            assert device is not None
            held = [device]
            share = gpu_share.fraction(claim.gpu_memory_gb, self.box.memory_mb(device))
        attempt = self._launch(claim, held, asked, share=share)
        store.record_start(self.engine, attempt.fence, devices=held, pgid=attempt.pgid)
        shared = "" if share is None else f" ({claim.gpu_memory_gb:g} GiB of it, shared)"
        attempt.note(
            f"attempt {fence.attempt} started on {self.worker_id}, "
            f"{self.box.accelerator} devices {held}{shared}, runner pid {attempt.pgid}"
        )
        log.info("job %s: claimed (attempt %d) on devices %s", fence.job_id, fence.attempt, held)
        return True

    def _start_node(self, start: Start) -> None:
        """Start this worker's node of a job across boxes whose gang is whole."""
        claim, held = start.claim, start.devices
        attempt = self._launch(claim, held, time.monotonic(), node=start)
        attempt.node = start.node
        fence = claim.fence
        if start.node == 0:  # the job's own record names node 0's runner
            store.record_start(self.engine, fence, devices=held, pgid=attempt.pgid)
        store.gang.node_started(self.engine, fence, self.worker_id, attempt.pgid)
        attempt.note(
            f"attempt {fence.attempt} started node {start.node} of {len(start.workers)} "
            f"on {self.worker_id}, {self.box.accelerator} devices {held}, "
            f"rendezvous {start.rendezvous}, runner pid {attempt.pgid}"
        )
        log.info("job %s: node %d started (attempt %d)", fence.job_id, start.node, fence.attempt)

    def _launch(
        self,
        claim: store.Claim,
        held: list[int],
        asked: float,
        *,
        share: float | None = None,
        node: Start | None = None,
    ) -> Attempt:
        """Start the claim's runner on ``held``; the attempt is this worker's from now."""
        processes = jobspec.world_size(claim.strategy, claim.devices)
        threads = jobspec.threads_per_process(len(held), len(self.box.devices), processes)
        job = store.load_job(self.engine, claim.fence.job_id)
        account = self.walls.account_for(self._uids_in_use())
        attempt = self.launcher.start(
            claim,
            job,
            held,
            accelerator=self.box.accelerator,
            threads=threads,
            claimed_at=asked,
            gpus=self.box.physical(held),
            memory_limit=self.box.memory_limit(held, processes),
            gpu_memory_fraction=share,
            on_exit=self._wake.set,
            node=node,
            walls=self.walls,
            account=account,
            holds=self.cache.holds(),
            checkpoints=self._checkpoint_sync(claim, job, node),
        )
        attempt.account = account
        files = JobFiles.of(
            self.settings.data_dir, claim.fence.job_id, None if node is None else node.node
        )
        # Rank 0's points and the runner's environment record reach the database
        # through this process: a runner holds no credential.
        attempt.reporter = DbReporter.of_attempt(
            self.engine,
            claim.fence,
            files,
            on_lease_lost=partial(attempt.lose_lease, "the store refused its points"),
            lease_s=self.settings.lease_s,
            marker_owner=None if account is None else (account.uid, account.gid),
        ).start()
        self.attempts[claim.fence.job_id] = attempt
        return attempt

    def _checkpoint_sync(
        self, claim: store.Claim, job: Job, node: Start | None
    ) -> CheckpointSync | None:
        """The attempt's checkpoint folder kept in the object store, if there is one."""
        if self.objects is None:
            return None
        fence = claim.fence
        root = JobFiles.of(self.settings.data_dir, fence.job_id).root
        sync = CheckpointSync(
            self.objects,
            job_id=fence.job_id,
            attempt=fence.attempt,
            node=0 if node is None else node.node,
            root=root,
            folder=root / CHECKPOINTS,
            interval_s=self.settings.storage_sync_s,
            on_trouble=partial(self._storage_trouble, fence),
        )
        self.checkpoints[fence.job_id] = sync
        return sync

    def _storage_trouble(self, fence: store.Fence, why: str | None) -> None:
        """Say in the job's log and reason that its checkpoints wait on this box's disk
        (``why``), or that they go up again (None). Called from the sync's thread."""
        attempt = self.attempts.get(fence.job_id)
        if why is not None:
            text = (
                f"checkpoints wait on {self.worker_id}'s disk: {why}; uploading them "
                "once the object store answers"
            )
        else:
            text = f"running on {self.worker_id}; checkpoints go to the object store again"
        if attempt is not None:
            attempt.note(text)
        store.record_executor(self.engine, fence, reason=(ReasonCode.running, text))

    def _preempt(self) -> None:
        """Stop running jobs here that a long-waiting job outranks, if it then fits."""
        self.preemptor.check(
            time.monotonic(),
            self.attempts,
            self.box,
            gang_held=self.gangs.held(),
            recipes=sorted(self.recipes),
        )

    def _pending(self) -> bool:
        if self.gangs.waiting is not None:
            return True
        return (
            store.pending_count(
                self.engine,
                max_devices=len(self.box.devices),
                accelerator=self.box.accelerator,
                recipes=sorted(self.recipes),
                gpu_total_gb=self.box.largest_share_gb(),
            )
            > 0
        )

    def _holdings(self) -> list[gpu_share.Holding]:
        held = [gpu_share.Holding(a.devices, a.share_gb) for a in self.attempts.values()]
        if self.gangs.held():  # waiting for a gang's other nodes
            held.append(gpu_share.Holding(self.gangs.held(), None))
        return held

    def _room_left(self) -> bool:
        """Whether a job could still start here: a device no attempt holds, or room on a
        GPU for a share."""
        offer = self.box.offer(self._holdings())
        return bool(offer.whole) or offer.largest_room_gb > 0

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
            if not self.database.down:  # an outage is reported once, by the watch
                log.exception("job %s: could not store %d log lines", attempt.job_id, len(lines))

    def _finish(self, attempt: Attempt) -> bool:
        """Record how an attempt ended, after its last process and log line are gone."""
        attempt.join_pumps()
        with attempt.hand_off.lock:  # a hand-off thread still placing inputs hands nothing
            attempt.hand_off.ended = True
        attempt.close_reporter()  # its last points stored before its end is
        # Its devices were held until now, whoever's job it is by now.
        self._charge([attempt])
        # Read once: the lease watchdog may mark the lease lost at any moment.
        stop = attempt.stop_reason
        if stop == StopReason.lease_lost:
            return True  # the job is another worker's now; we may not write about it
        fence = attempt.fence
        files = JobFiles.of(self.settings.data_dir, fence.job_id, attempt.node)
        report = runner_report(files, fence.attempt)
        outcome = self._decide(attempt, stop, report)
        if attempt.node is not None and stop is None and report is not None and report.preempted:
            # Its ranks stopped with their peers (the stop flag is all-reduced): the node
            # whose worker sent the SIGTERM records how the attempt ended. Sent by no
            # worker (the job's own), no one does: the lease lapses and the job is retried.
            attempt.note_ended(f"attempt {fence.attempt}: node {attempt.node} stopped with all")
            self._write_lines(attempt)
            self._take_back(attempt, files)
            return True
        follower = report is not None and not report.leader
        if attempt.node is not None and outcome.status == JobStatus.succeeded and follower:
            # its ranks are done; the node with global rank 0 ends the job
            attempt.note_ended(f"attempt {fence.attempt}: node {attempt.node} done")
            self._write_lines(attempt)
            store.gang.node_done(self.engine, fence.job_id, self.worker_id)
            return True
        attempt.note_ended(f"attempt {fence.attempt} ended: {outcome.reason_message}")
        self._write_lines(attempt)
        # Before the store hears of it: once it does, the job may be claimed again (here
        # or, on a shared DATA_DIR, on another box) and its folder handed over anew.
        self._take_back(attempt, files)
        if outcome.status == JobStatus.queued:  # handed back (shutdown, preempted)
            store.release_attempt(  # no attempt spent
                self.engine, fence, outcome.reason_code, outcome.reason_message
            )
        else:
            store.finish_attempt(self.engine, fence, outcome)
        log.info("job %s: attempt %d %s", attempt.job_id, fence.attempt, outcome.reason_message)
        return True

    def _decide(
        self, attempt: Attempt, stop: StopReason | None, report: RunnerReport | None
    ) -> store.Outcome:
        return decide(
            stop,
            report,
            attempt.proc.returncode or 0,  # set: finished() saw it exit
            timeout_s=attempt.timeout_s,
            stall_timeout_s=self.settings.stall_timeout_s,
            worker_id=self.worker_id,
            preempted_by=attempt.preempted_by,
            lost_node=attempt.lost_node,
        )

    def _take_back(self, attempt: Attempt, files: JobFiles) -> None:
        """The job's folder and the virtualenvs it built, back to the worker's account."""
        try:
            self.walls.take_back(files.root, self.settings.cache_path / "venvs")
        except OSError:  # the folder stays the job account's; the outcome is still recorded
            log.exception("job %s: its folder could not be taken back", attempt.job_id)

    def _shutdown(self) -> None:
        """Leave nothing running: kill what is left, hand its jobs back, say goodbye."""
        if self.listener is not None:
            self.listener.stop()
        self.leases.stop_watchdog()
        self.database.call(self.gangs.leave_all)
        for attempt in self.attempts.values():
            attempt.request_stop(StopReason.shutdown, 0.0)
        grace_s = self.settings.kill_grace_s
        deadline = time.monotonic() + grace_s
        while self.attempts and time.monotonic() < deadline:
            self._supervise(time.monotonic())
            time.sleep(0.05)  # a few ticks at most: every attempt was just told to stop
        for attempt in self.attempts.values():  # past the grace: nothing may outlive us
            attempt.signal(signal.SIGKILL)
        while self.attempts and time.monotonic() < deadline + grace_s:
            self._supervise(time.monotonic())
            time.sleep(0.05)
        self.database.call(partial(catalog.worker_stopped, self.engine, self.worker_id))
        for attempt in self.attempts.values():  # not finished: their reporters stop here
            attempt.close_reporter()
        self.engine.dispose()
        self.launcher.close()
