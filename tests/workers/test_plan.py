"""The launch plan: how an attempt's processes start, from its resolved strategy."""

from __future__ import annotations

import pytest

from service.models import Strategy
from workers.plan import Launch, LaunchPlan


@pytest.mark.parametrize(
    ("strategy", "devices", "nodes", "launch", "local", "world"),
    [
        (Strategy.single, 1, 1, Launch.in_process, 1, 1),
        (Strategy.dp, 4, 1, Launch.in_process, 1, 1),  # one process, every device
        (Strategy.ddp, 2, 1, Launch.local_ranks, 2, 2),
        (Strategy.ddp, 2, 3, Launch.elastic, 2, 6),  # a job across boxes
    ],
)
def test_each_strategy_starts_its_processes_one_way(
    strategy: Strategy, devices: int, nodes: int, launch: Launch, local: int, world: int
) -> None:
    plan = LaunchPlan.of(strategy, devices, nodes)
    assert (plan.launch, plan.local_ranks, plan.world_size) == (launch, local, world)
    assert plan.distributed == (strategy == Strategy.ddp)
    assert plan.data_parallel == (strategy == Strategy.dp)
