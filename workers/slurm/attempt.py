"""One attempt in Slurm, as the Slurm worker follows it: the state its loop and its
lease keeper share."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from service.models import Job
from service.store import Fence, Held
from workers.jobfiles import JobFiles
from workers.outcome import StopReason
from workers.slurm.logs import LogTail
from workers.supervisor.reporter import DbReporter

log = logging.getLogger(__name__)


@dataclass
class Submitted:
    """An attempt submitted (or about to be) as one Slurm batch job.

    The worker's loop owns it, but for ``held`` (the lease keeper's last renewal, read by
    the loop) and ``lose``, which the keeper and a reporter's thread may call at any
    moment: it marks the attempt lost under a lock, once, and cancels its Slurm job."""

    job: Job
    fence: Fence
    files: list[JobFiles]  # one per node (a single one for a job on one node)
    logs: list[LogTail]  # its output files: stdout's (with the worker's notes), stderr's
    slurm_id: str | None = None  # None until sbatch answered
    missing: int = 0  # polls in a row whose squeue did not list it
    running_since: float | None = None  # monotonic: when Slurm started it (less its pauses)
    charged_until: float | None = None  # monotonic; None while Slurm does not run it
    stop: StopReason | None = None  # why the worker stopped it (the first reason stands)
    stop_sent: bool = False  # its scancel went through
    last_step: int | None = None  # the stall watch: the step last seen ...
    last_advance: float | None = None  # ... and when it last moved (while Slurm runs it)
    reason: str = ""  # Slurm's waiting reason last written
    reporters: list[DbReporter] = field(default_factory=list)
    held: Held | None = None  # the last renewal of its lease (the lease keeper's)
    cancel: Callable[[str], None] | None = None  # scancel, for ``lose``
    _lost: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def devices(self) -> int:
        return self.job.devices * self.job.nodes

    @property
    def lost(self) -> bool:
        with self._lock:
            return self._lost

    def lose(self, why: str) -> bool:
        """The job is not (provably) this worker's any more: its Slurm job must not train
        on, and nothing more is written about it. False if it was lost already."""
        with self._lock:
            if self._lost:
                return False
            self._lost = True
            slurm_id = self.slurm_id
        log.error("job %s: lease lost (%s); cancelling Slurm job %s", self.job.id, why, slurm_id)
        if slurm_id is not None and self.cancel is not None:
            try:
                self.cancel(slurm_id)
            except Exception:  # its own lease watch stops it past LEASE_S
                log.exception("job %s: scancel %s failed", self.job.id, slurm_id)
        return True

    def uncharged(self, now: float) -> float:
        """Device-seconds Slurm ran it since the last charge (fair share)."""
        if self.charged_until is None:
            return 0.0
        return self.devices * max(0.0, now - self.charged_until)

    def close_reporters(self) -> None:
        for reporter in self.reporters:
            reporter.close()
