"""When a waiting job may stop running ones: the rule, in one place, on plain values.

A waiting job outranks a running one when the claim would serve it first, by a margin:
its owner has a quarter of the running job's owner's usage or less (fair share), or the
same usage or less and a higher priority (a user's own urgent job, or a colleague's).
Following the claim's order means a victim, requeued, is not claimed back before the
job it made room for. Every shape of job may be a victim: whole devices, a share of a
GPU, and a node of a job across boxes (its whole gang stops, each node checkpointing).
Whether the waiting job would then fit is the worker's to say (it knows its devices and
what each attempt holds on them): ``choose`` asks it through ``fits``. The worker
(``workers.supervisor.preemptor``) asks the store for the contenders and stops the
victims; this module only decides.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import NamedTuple

# Fair share's margin, in its scores' unit (log2 of usage): 2 is a quarter of the usage.
FAR_BELOW = 2.0


class Contender(NamedTuple):
    """A job in the decision: queued and waiting long enough, or running and stoppable."""

    job_id: int
    owner: str
    score: float  # the owner's fair-share score (service.fair_share): less is lighter
    priority: int
    devices: int  # whole devices, or 1 with a share
    share_gb: float | None = None  # a share of one GPU (gpu_memory_gb); None: whole devices
    nodes: int = 1  # a job across boxes: stopping it here stops every node


# Whether a waiting job would fit on the box were these running jobs (ids) stopped.
Fits = Callable[[Contender, frozenset[int]], bool]


def outranks(waiting: Contender, running: Contender) -> bool:
    """Whether ``waiting`` may stop ``running`` to take its devices."""
    if waiting.score <= running.score - FAR_BELOW:
        return True
    return waiting.score <= running.score and waiting.priority > running.priority


def choose(
    waiting: Iterable[Contender], running: list[Contender], fits: Fits
) -> tuple[Contender, list[Contender]] | None:
    """The first waiting job (in the claim's order) that stopping running jobs it outranks
    would make fit, with those victims: the lowest-ranked first (the heaviest user's,
    the lowest priority, the newest), none it does not need. None when no waiting job
    would then fit: nothing is stopped for a job that still could not start."""
    for job in waiting:
        if fits(job, frozenset()):
            continue  # it fits now: the claim takes it, with no one stopped
        victims = sorted(
            (r for r in running if outranks(job, r)),
            key=lambda r: (-r.score, r.priority, -r.job_id),
        )
        chosen: list[Contender] = []
        for victim in victims:
            chosen.append(victim)
            if fits(job, frozenset(v.job_id for v in chosen)):
                break
        else:
            continue  # stopping all it outranks would not make room
        # Shares free memory on one GPU only: a victim taken on the way (on another GPU)
        # may not be needed. Spare the highest-ranked first.
        for victim in reversed(chosen[:-1]):
            rest = frozenset(v.job_id for v in chosen if v is not victim)
            if fits(job, rest):
                chosen.remove(victim)
        return job, chosen
    return None
