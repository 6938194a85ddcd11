"""How an attempt's processes start, decided once from its resolved strategy: the one
place that asks which strategy a job has. (``service.jobspec.resolve_strategy`` turns
``auto`` into one; everything after asks the plan.)

- ``in_process``: ``single`` and ``dp``: one process trains, the runner's own (or a
  script's one process), seeing all of the job's devices.
- ``local_ranks``: ``ddp`` on one box: one process per device, meeting on a store the
  runner serves on loopback (a script: torch's elastic launch on this box).
- ``elastic``: ``ddp`` across boxes: torch's elastic launch on every node, meeting on
  node 0's store.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from service.jobspec import world_size
from service.models import Strategy


class Launch(StrEnum):
    in_process = "in_process"  # single, dp: one process trains
    local_ranks = "local_ranks"  # ddp on one box: a process per device
    elastic = "elastic"  # ddp across boxes: the elastic launch on every node


@dataclass(frozen=True)
class LaunchPlan:
    """An attempt's processes: how they start, how many on this box and in all, and how
    the model is wrapped."""

    strategy: Strategy  # resolved: never auto
    launch: Launch
    local_ranks: int  # processes that train on this box
    world_size: int  # processes that train, on every box

    @classmethod
    def of(cls, strategy: Strategy, devices: int, nodes: int = 1) -> LaunchPlan:
        if strategy != Strategy.ddp:
            return cls(strategy, Launch.in_process, 1, 1)
        launch = Launch.elastic if nodes > 1 else Launch.local_ranks
        return cls(strategy, launch, devices, world_size(strategy, devices, nodes))

    @property
    def distributed(self) -> bool:
        """Whether its ranks train in a process group (DDP)."""
        return self.launch != Launch.in_process

    @property
    def data_parallel(self) -> bool:
        """Whether one process splits each batch over its devices (``dp``)."""
        return self.strategy == Strategy.dp
