"""Training one job on one rank: the loop every strategy shares, and what it needs.

- ``spec``: ``RunSpec``, the job resolved for this worker, and ``resolve`` (Job -> spec).
- ``loop``: the ``Trainer`` (batch, epoch, train), the stop rule, validation.
- ``data``: the batches, and the sampler that resumes mid-epoch.
- ``checkpoint``: saving and resuming the exact position; the final weights.
- ``progress``: rank 0's metric and progress points, at the speed it trains.

Callers use the names re-exported here.
"""

from workers.training.data import ResumableSampler, batches
from workers.training.loop import (
    STOP_REQUESTED,
    Preempted,
    Trainer,
    evaluate,
    stop_on_sigterm,
)
from workers.training.progress import InProcess, Reports, Sink
from workers.training.spec import RunSpec, resolve

__all__ = [
    "STOP_REQUESTED",
    "Preempted",
    "InProcess",
    "Reports",
    "ResumableSampler",
    "RunSpec",
    "Sink",
    "Trainer",
    "batches",
    "evaluate",
    "resolve",
    "stop_on_sigterm",
]
