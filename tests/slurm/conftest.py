"""Fixtures for Trainyard in front of a real Slurm cluster on this host
(tests/slurm_cluster.py): a cluster per test module, and a stack whose worker submits
to it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.slurm_cluster import SlurmCluster
from tests.stack import Stack, running_stack


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    reason = SlurmCluster.available()
    if reason is not None:
        if os.environ.get("TRAINYARD_TEST_REQUIRE_SLURM") == "1":  # CI installed it
            pytest.fail(reason)
        pytest.skip(reason)
    with SlurmCluster(tmp_path_factory.mktemp("slurm")) as c:
        yield c


@pytest.fixture
def slurm_stack(tmp_path: Path, cluster: SlurmCluster) -> Iterator[Stack]:
    """The API on SQLite (a Slurm worker serves from one submit host), its processes
    finding the cluster through SLURM_CONF; tests start the Slurm worker."""
    with running_stack(tmp_path, **{}) as s:
        s.env.update(cluster.env)
        yield s
    cluster.run("scancel", "--me")  # nothing of one test is left for the next


def start_slurm_worker(stack: Stack, name: str = "slurm", **settings: object) -> object:
    defaults: dict[str, object] = {"slurm_poll_interval_s": 0.5, "cpu_slots": 2}
    return stack.start_worker(name, executor="slurm", **{**defaults, **settings})
