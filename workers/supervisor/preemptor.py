"""Preemption, on the worker whose devices are taken: every PREEMPT_CHECK_EVERY_S, if a
job that has waited ``preempt_after_s`` outranks running jobs here and stopping them
would make it fit (``service.preemption`` decides), each victim is marked (fenced, with
its audit event) and stopped as a shutdown stops a job: SIGTERM, "checkpoint where you
are", SIGKILL after the kill grace. It goes back to the queue without spending an
attempt and resumes from that checkpoint (``workers.outcome.decide``)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from sqlalchemy import Engine

from service import preemption
from service.models import utcnow
from service.settings import Settings
from service.store.preemption import contenders, mark_preempted
from workers.outcome import StopReason

if TYPE_CHECKING:
    from workers.supervisor.attempt import Attempt

log = logging.getLogger(__name__)

# How often a full worker weighs the queue: a query (two), not on every tick.
PREEMPT_CHECK_EVERY_S = 5.0


class Preemptor:
    def __init__(self, engine: Engine, settings: Settings) -> None:
        self.engine = engine
        self.settings = settings
        self._checked_at = float("-inf")

    def check(
        self,
        now: float,
        attempts: dict[int, Attempt],
        *,
        free: int,
        total: int,
        accelerator: str,
        recipes: list[str],
    ) -> None:
        """Stop the running jobs a long-waiting job outranks, if that makes it fit.
        ``free``: whole devices no attempt holds; ``now``: monotonic."""
        after_s = self.settings.preempt_after_s
        if after_s is None or not attempts or now - self._checked_at < PREEMPT_CHECK_EVERY_S:
            return
        self._checked_at = now
        # Devices of attempts already stopping for someone count as free: one waiting
        # job must not take two rounds of victims.
        stopping = [a for a in attempts.values() if a.stop_reason is not None]
        free += sum(len(a.devices) for a in stopping if a.stop_reason == StopReason.preempted)
        running = [job_id for job_id, a in attempts.items() if a.stop_reason is None]
        waiting, stoppable = contenders(
            self.engine,
            accelerator=accelerator,
            recipes=recipes,
            total_devices=total,
            running=running,
            now=utcnow(),
            waited_s=after_s,
            cooldown_s=self.settings.preempt_cooldown_s,
        )
        chosen = preemption.choose(waiting, stoppable, free)
        if chosen is None:
            return
        job, victims = chosen
        for victim in victims:
            attempt = attempts[victim.job_id]
            if not mark_preempted(self.engine, attempt.fence, job):
                continue  # no longer this attempt's (cancelled, lease lost): not ours to stop
            by = f"job {job.job_id} ({job.owner}'s, priority {job.priority})"
            log.info("job %s: preempted by %s", victim.job_id, by)
            attempt.note(f"preempted by {by}: checkpointing and stopping")
            attempt.preempted_by = by
            attempt.request_stop(StopReason.preempted, self.settings.kill_grace_s)
