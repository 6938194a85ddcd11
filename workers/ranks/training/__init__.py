"""Training one job on one rank: the loop every strategy shares, and what it needs.

- ``spec``: ``RunSpec``, the job resolved for this worker, and ``resolve`` (Job -> spec).
- ``loop``: the ``Trainer`` (batch, epoch, train), the stop rule, validation.
- ``data``: the batches, and the sampler that resumes mid-epoch.
- ``checkpoint``: saving and resuming the exact position; the final weights.
- ``progress``: rank 0's metric and progress points, at the speed it trains.

Callers use the names re-exported here.
"""

from workers.ranks.training.data import ResumableSampler, batches
from workers.ranks.training.loop import Trainer, evaluate
from workers.ranks.training.progress import InProcess, Reports, Sink
from workers.ranks.training.spec import RunSpec, resolve
from workers.stopping import STOP_REQUESTED, Preempted, stop_on_sigterm

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
