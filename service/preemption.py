"""When a waiting job may stop running ones: the rule, in one place, on plain values.

A waiting job outranks a running one when the claim would serve it first, by a margin:
its owner has a quarter of the running job's owner's usage or less (fair share), or the
same usage or less and a higher priority (a user's own urgent job, or a colleague's).
Following the claim's order means a victim, requeued, is not claimed back before the
job it made room for. The worker (``workers.supervisor.preemptor``) asks the store for the
contenders and stops the victims; this module only decides.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

# Fair share's margin, in its scores' unit (log2 of usage): 2 is a quarter of the usage.
FAR_BELOW = 2.0


class Contender(NamedTuple):
    """A job in the decision: queued and waiting long enough, or running and stoppable."""

    job_id: int
    owner: str
    score: float  # the owner's fair-share score (service.fair_share): less is lighter
    priority: int
    devices: int


def outranks(waiting: Contender, running: Contender) -> bool:
    """Whether ``waiting`` may stop ``running`` to take its devices."""
    if waiting.score <= running.score - FAR_BELOW:
        return True
    return waiting.score <= running.score and waiting.priority > running.priority


def choose(
    waiting: Iterable[Contender], running: list[Contender], free: int
) -> tuple[Contender, list[Contender]] | None:
    """The first waiting job (in the claim's order) that stopping running jobs it outranks
    would make fit, with those victims: the lowest-ranked first (the heaviest user's,
    the lowest priority, the newest), no more than it needs. None when no waiting job
    would then fit: nothing is stopped for a job that still could not start."""
    for job in waiting:
        if job.devices <= free:
            continue  # it fits now: the claim takes it, with no one stopped
        victims = sorted(
            (r for r in running if outranks(job, r)),
            key=lambda r: (-r.score, r.priority, -r.job_id),
        )
        chosen: list[Contender] = []
        room = free
        for victim in victims:
            if room >= job.devices:
                break
            chosen.append(victim)
            room += victim.devices
        if room >= job.devices:
            return job, chosen
    return None
