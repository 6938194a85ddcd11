"""Preemption, on the worker whose devices are taken: every PREEMPT_CHECK_EVERY_S, if a
job that has waited ``preempt_after_s`` outranks running jobs here and stopping them
would make it fit (``service.preemption`` decides; whether it fits is this box's
bookkeeping of whole devices and shares of GPUs), each victim is marked (fenced, with
its audit event) and stopped as a shutdown stops a job: SIGTERM, "checkpoint where you
are", SIGKILL after the kill grace. It goes back to the queue without spending an
attempt and resumes from that checkpoint (``workers.outcome.decide``). A victim that is
one node of a job across boxes takes its gang with it: the other nodes' workers read
the mark as their leases renew (``workers.supervisor.lease``) and stop theirs."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine

from service import preemption
from service.models import Accelerator, utcnow
from service.preemption import Contender
from service.settings import Settings
from service.store.preemption import contenders, mark_preempted
from workers.outcome import StopReason
from workers.supervisor import gpu_share

if TYPE_CHECKING:
    from workers.supervisor.attempt import Attempt
    from workers.supervisor.devices import Box

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
        box: Box,
        *,
        gang_held: list[int],
        recipes: list[str],
    ) -> None:
        """Stop the running jobs a long-waiting job outranks, if that makes it fit.
        ``gang_held``: devices held for a gang still forming; ``now``: monotonic."""
        after_s = self.settings.preempt_after_s
        if after_s is None or not attempts or now - self._checked_at < PREEMPT_CHECK_EVERY_S:
            return
        self._checked_at = now
        running = [job_id for job_id, a in attempts.items() if a.stop_reason is None]
        waiting, stoppable = contenders(
            self.engine,
            accelerator=box.accelerator,
            recipes=recipes,
            total_devices=len(box.devices),
            largest_share_gb=box.largest_share_gb(),
            running=running,
            now=utcnow(),
            waited_s=after_s,
            cooldown_s=self.settings.preempt_cooldown_s,
        )
        # Attempts already stopping for someone count as gone: one waiting job must not
        # take two rounds of victims. A gang still forming holds its devices.
        holdings = {
            job_id: gpu_share.Holding(a.devices, a.share_gb)
            for job_id, a in attempts.items()
            if a.stop_reason != StopReason.preempted
        }
        if gang_held:
            holdings[-1] = gpu_share.Holding(gang_held, None)  # (no job's id)
        shareable = box.accelerator == Accelerator.cuda
        fits = holdings_fit(holdings, box.devices, shareable=shareable)
        chosen = preemption.choose(waiting, stoppable, fits)
        if chosen is None:
            return
        job, victims = chosen
        for victim in victims:
            attempt = attempts[victim.job_id]
            if not mark_preempted(self.engine, attempt.fence, job):
                continue  # no longer this attempt's (cancelled, lease lost): not ours to stop
            by = f"job {job.job_id} ({job.owner}'s, priority {job.priority})"
            log.info("job %s: preempted by %s", victim.job_id, by)
            gang = " with the rest of its nodes" if victim.nodes > 1 else ""
            attempt.note(f"preempted by {by}: checkpointing and stopping{gang}")
            attempt.preempted_by = by
            attempt.request_stop(StopReason.preempted, self.settings.kill_grace_s)


def holdings_fit(
    holdings: dict[int, gpu_share.Holding], devices: list[dict[str, Any]], *, shareable: bool
) -> preemption.Fits:
    """Whether a waiting job would fit on these ``devices`` were some of the running jobs
    (``holdings``: what each holds, by job id) stopped. By the bookkeeping alone: NVML's
    free memory, which still counts the victims' until they exit, is the claim's to
    check."""

    def fits(job: Contender, stopped: frozenset[int]) -> bool:
        kept = [held for job_id, held in holdings.items() if job_id not in stopped]
        offer = gpu_share.offer(devices, kept, shareable=shareable)
        if job.share_gb is None:
            return len(offer.whole) >= job.devices
        return gpu_share.place(offer.rooms, job.share_gb) is not None

    return fits
