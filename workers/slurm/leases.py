"""The Slurm worker's leases, kept on a thread of their own: the worker's loop runs
Slurm's commands and places inputs (a download may take minutes), and none of that may
keep a lease from being renewed. Each renewal also tells the batch jobs that their
worker is alive: they stop themselves when it falls silent (``workers.slurm.batch``)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import Engine

from service import catalog, store
from workers.jobfiles import write_atomic
from workers.slurm.attempt import Submitted

log = logging.getLogger(__name__)


class LeaseKeeper:
    """Every ``interval_s``: the worker's heartbeat, its attempts' leases renewed (a
    refused one is lost: its Slurm job is cancelled), the alive file written, and lapsed
    leases of any worker requeued."""

    def __init__(
        self,
        engine: Engine,
        worker_id: str,
        attempts: Callable[[], list[Submitted]],
        *,
        lease_s: float,
        interval_s: float,
        alive_file: Path,
        on_renewed: Callable[[], None],
    ) -> None:
        self.engine = engine
        self.worker_id = worker_id
        self.attempts = attempts
        self.lease_s = lease_s
        self.interval_s = interval_s
        self.alive_file = alive_file
        self.on_renewed = on_renewed  # wakes the loop: a cancel may need acting on
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="slurm-leases", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.renew()
            except Exception:  # the database is down: the leases run out, the jobs stop
                log.exception("lease renewal failed")
            self._stop.wait(self.interval_s)

    def renew(self) -> None:
        catalog.worker_heartbeat(self.engine, self.worker_id)
        live = [a for a in self.attempts() if not a.lost]
        # one statement for hundreds: no other worker renews these jobs
        held = store.renew_leases_at_once(self.engine, [a.fence for a in live], self.lease_s)
        for attempt in live:
            state = held.get(attempt.fence.job_id)
            if state is None:
                attempt.lose("the database refused its lease's renewal")
            attempt.held = state
        # Only once renewed: a worker that cannot reach the database holds no lease,
        # and its batch jobs must not count it alive.
        write_atomic(self.alive_file, f"{time.time():.0f}\n")
        # After renewing ours: a long pause here must not requeue this worker's own jobs.
        for job_id in store.expire_leases(self.engine):
            log.warning("job %s: its worker's lease expired; requeued", job_id)
        self.on_renewed()
