"""The leases on running jobs: their renewal (with the cancel and stall checks it brings
back), the requeue of jobs whose worker went silent or restarted (and the kill of what
its last run left), and the watchdog thread that kills an attempt whose lease lapsed, so
that a worker that cannot reach the database stops training jobs another may be given."""

from __future__ import annotations

import logging
import threading
import time

from sqlalchemy import Engine

from service import store
from service.models import JobStatus
from workers.outcome import StopReason
from workers.procfs import kill_leftovers
from workers.supervisor.attempt import Attempt

log = logging.getLogger(__name__)

# The lease watchdog looks at least this often (and at the moment a lease would lapse).
LEASE_WATCHDOG_EVERY_S = 1.0


class Leases:
    """Keeps the leases of ``attempts`` (the supervisor's own dict: job id -> attempt)."""

    def __init__(
        self,
        engine: Engine,
        attempts: dict[int, Attempt],
        *,
        lease_s: float,
        kill_grace_s: float,
        stall_timeout_s: float,
    ) -> None:
        self.engine = engine
        self.attempts = attempts
        self.lease_s = lease_s
        self.kill_grace_s = kill_grace_s
        self.stall_timeout_s = stall_timeout_s
        self._stop = threading.Event()
        self._watchdog: threading.Thread | None = None

    def renew(self) -> None:
        """Extend the leases of live attempts; stop those cancelled or stalled, kill those
        the database refused; requeue jobs whose worker let its lease expire."""
        live = {jid: a for jid, a in self.attempts.items() if not a.lease_lost}
        asked = time.monotonic()
        held = store.renew_lease(self.engine, [a.fence for a in live.values()], self.lease_s)
        now = time.monotonic()
        for job_id, attempt in live.items():
            lease = held.get(job_id)
            if lease is None:  # someone else owns the job now
                attempt.lose_lease("refused by the database")
                continue
            attempt.renewed(asked)  # leases run from when we asked, not when it returned
            if lease.status == JobStatus.cancelling:
                attempt.request_stop(StopReason.cancel, self.kill_grace_s)
            elif lease.preempted and attempt.stop_reason is None:
                # another node's worker stopped the gang: this node checkpoints and stops
                # with it (its ranks would otherwise wait on the stopped ones)
                attempt.preempted_by = "another job, with the rest of its nodes"
                attempt.note("preempted with the rest of its nodes: checkpointing and stopping")
                attempt.request_stop(StopReason.preempted, self.kill_grace_s)
            if attempt.saw_step(lease.step, now) > self.stall_timeout_s:
                attempt.request_stop(StopReason.stalled, self.kill_grace_s)
        for job_id in store.expire_leases(self.engine):
            log.warning("job %s: its worker's lease expired; requeued", job_id)

    def recover(self, worker_id: str) -> None:
        """Kill what a previous run of this worker left behind and requeue its jobs."""
        for job in store.active_jobs_of(self.engine, worker_id):
            if job.runner_pgid is not None and job.lease_expires_at is not None:
                # nothing started after the lease ran out can belong to the attempt
                expiry = job.lease_expires_at.timestamp()
                killed = kill_leftovers(job.runner_pgid, expiry, self.kill_grace_s)
                log.warning("job %s: killed %d process(es) left by a previous run", job.id, killed)
        for held in store.gang.held_by(self.engine, worker_id):  # its nodes across boxes
            if held.status == JobStatus.queued:  # it was waiting in the job's gang
                store.gang.leave(self.engine, held.job_id, worker_id)
            elif held.runner_pgid is not None and held.lease_expires_at is not None:
                expiry = held.lease_expires_at.timestamp()
                killed = kill_leftovers(held.runner_pgid, expiry, self.kill_grace_s)
                log.warning("job %s: killed %d process(es) of its node", held.job_id, killed)
        for job_id in store.abandon_worker_jobs(self.engine, worker_id):
            log.warning("job %s: requeued after this worker restarted", job_id)

    def start_watchdog(self) -> None:
        """Start the thread that kills attempts whose lease lapsed."""
        self._stop = threading.Event()  # a fresh one: a supervisor may run more than once
        self._watchdog = threading.Thread(target=self._watch, name="lease-watchdog", daemon=True)
        self._watchdog.start()

    def stop_watchdog(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        """Kill every attempt whose lease was not renewed for a whole lease: this worker can
        no longer prove it owns the job (another worker may be given it), so it must not
        train it on. A thread of its own that never touches the database, so a database
        call that hangs (a network partition) cannot delay it."""
        wait = LEASE_WATCHDOG_EVERY_S
        while not self._stop.wait(wait):
            now = time.monotonic()
            wait = LEASE_WATCHDOG_EVERY_S
            # list(): one C call under the GIL, so the loop adding or removing an attempt
            # meanwhile cannot break the iteration; each attempt guards its own state.
            for attempt in list(self.attempts.values()):
                if attempt.lease_lapsed(now, self.lease_s):
                    continue
                lapses_in = attempt.lease_left(now, self.lease_s)
                if lapses_in >= 0:
                    wait = min(wait, lapses_in + 0.001)  # wake just past the moment
