"""What one attempt trains: the job's spec resolved for this worker, made in one place.

``resolve`` is the only way from a ``Job`` to a ``RunSpec``: ``auto`` choices come from
``service.jobspec`` (the rules the API and the claim use too), the recipe checks its
params once, and the result is a frozen, picklable record every rank gets.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from enum import StrEnum
from pathlib import Path
from typing import Any

import pydantic
from pydantic import BaseModel

from service.jobspec import resolve_accelerator, resolve_strategy, strategy_problem
from service.models import Accelerator, Job, Optimizer, Precision, Strategy
from service.reasons import ReasonCode
from workers.errors import NotRetryable
from workers.jobfiles import JobFiles, runner_dir, shared_checkpoints
from workers.plan import LaunchPlan
from workers.recipes import Recipe


@dataclass(frozen=True)
class RunSpec:
    """A job spec resolved for this worker; picklable, so mp.spawn can hand it to ranks.

    Its fields are the spec.json artifact's top level (what a rerun needs); the enums
    serialise as their values, so that JSON reads as plain strings.
    """

    job_id: int
    recipe: str
    params: dict[str, Any]  # validated by the recipe and dumped back to plain values
    strategy: Strategy  # single | dp | ddp (never auto)
    accelerator: Accelerator  # cpu | cuda (never auto)
    devices: int
    epochs: int
    batch_size: int
    lr: float
    optimizer: Optimizer
    seed: int
    precision: Precision
    checkpoint_every: int
    job_dir: str
    recipes_dir: str | None = None
    package: str | None = None  # an uploaded package defining the recipe (unpacked here)
    threads: int = 1  # torch intra-op threads per process on CPU
    attempt: int = 1
    nodes: int = 1  # boxes it spans (ddp): world_size is nodes x devices
    node: int | None = None  # a job across boxes: this box's node (its hand-offs' folder)
    # a job across boxes checkpoints in the folder every box shares (SHARED_DIR)
    checkpoint_dir: str | None = None

    def __post_init__(self) -> None:
        # A spec read back from spec.json (a rerun, the chaos tests) has plain strings.
        for name, enum in _ENUM_FIELDS.items():
            object.__setattr__(self, name, enum(getattr(self, name)))

    @property
    def plan(self) -> LaunchPlan:
        """How its processes start (``workers.plan``): ask it, not the strategy."""
        return LaunchPlan.of(self.strategy, self.devices, self.nodes)

    @property
    def world_size(self) -> int:
        return self.plan.world_size

    @property
    def files(self) -> JobFiles:
        return JobFiles(Path(self.job_dir), runner_dir(self.node))

    @property
    def checkpoints(self) -> Path:
        """Where its checkpoints are: the job's folder, or the shared one across boxes."""
        return Path(self.checkpoint_dir) if self.checkpoint_dir else self.files.checkpoints

    def as_dict(self) -> dict[str, Any]:
        """Plain values only: what a checkpoint (loaded with weights_only) and JSON can hold."""
        return {
            f.name: str(v) if isinstance(v := getattr(self, f.name), StrEnum) else v
            for f in fields(self)
        }


_ENUM_FIELDS: dict[str, type[StrEnum]] = {
    "strategy": Strategy,
    "accelerator": Accelerator,
    "optimizer": Optimizer,
    "precision": Precision,
}


def resolve(
    job: Job,
    recipe: Recipe,
    *,
    accelerator: Accelerator | str,
    threads: int,
    data_dir: Path,
    recipes_dir: Path | None,
    attempt: int = 1,
    package: Path | None = None,
    shared_dir: Path | None = None,
    in_store: bool = False,
    node: int | None = None,
) -> tuple[RunSpec, BaseModel]:
    """The job's spec for this worker (``auto`` made concrete) and its validated params."""
    assert job.id is not None
    acc = resolve_accelerator(job.accelerator, accelerator)
    strategy = resolve_strategy(job.strategy, job.devices)
    problem = strategy_problem(strategy, job.devices, acc)
    if problem is not None:
        raise NotRetryable(ReasonCode.bad_spec, problem)
    try:
        params = recipe.params.model_validate(job.params)
    except pydantic.ValidationError as exc:
        raise NotRetryable(
            ReasonCode.bad_params, f"recipe {recipe.name} rejected params: {exc}"
        ) from exc
    spec = RunSpec(
        job_id=job.id,
        recipe=recipe.name,
        params=params.model_dump(),
        strategy=strategy,
        accelerator=acc,
        devices=job.devices,
        epochs=job.epochs,
        batch_size=job.batch_size,
        lr=job.lr,
        optimizer=Optimizer(job.optimizer),
        seed=job.seed,
        precision=Precision(job.precision),
        checkpoint_every=job.checkpoint_every,
        job_dir=str(JobFiles.of(data_dir, job.id).root),
        recipes_dir=str(recipes_dir) if recipes_dir else None,
        package=str(package) if package else None,
        threads=threads,
        attempt=attempt,
        nodes=job.nodes,
        node=node,
        checkpoint_dir=shared_checkpoints(job, shared_dir, in_store=in_store),
    )
    return spec, params
