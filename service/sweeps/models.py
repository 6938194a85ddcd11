"""A sweep's tables and the API schemas built on them: ``SweepCreate`` (what is posted),
``Sweep`` and ``SweepTrial`` (the rows), ``SweepRead`` and ``TrialRead`` (what is shown).

A sweep searches a space of settings of one job spec: each trial is an ordinary job
(``job.sweep_id``) whose spec is the template with the trial's values in it.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, StrictBool, StringConstraints
from sqlalchemy import JSON, Index
from sqlmodel import Field, SQLModel

from service.models import (
    USER_NAME_MAX,
    EnumAsString,
    Int,
    IntOrNone,
    JobCreate,
    JobStatus,
    NulFreeStr,
    Number,
    Progress,
    Reason,
    UTCDateTime,
    utcnow,
)

# The most trials one sweep may ask for, and run at once.
MAX_TRIALS = 10_000
MAX_PARALLEL = 1_000
MAX_PARAMETERS = 32
MAX_CHOICES = 1_000

# A parameter's name: a field of the job spec (``lr``), a key of its params
# (``params.hidden``), or for a script a name its entrypoint holds as ``{name}``.
ParameterName = Annotated[
    str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_-]+)?$", max_length=100)
]
Choice = str | int | float | bool | None


class FloatRange(BaseModel):
    """Real values from low to high: on a log scale with ``log``, or on a grid of ``step``."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["float"]
    low: Number
    high: Number
    log: StrictBool = False
    step: Number | None = Field(None, gt=0, description="Values low, low+step, … (not with log).")


class IntRange(BaseModel):
    """Whole values from low to high, every ``step``th; on a log scale with ``log``."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["int"]
    low: Int
    high: Int
    step: Int = Field(1, ge=1)
    log: StrictBool = False


class Categorical(BaseModel):
    """One of the values given."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["categorical"]
    values: list[Choice] = Field(min_length=1, max_length=MAX_CHOICES)


Parameter = Annotated[FloatRange | IntRange | Categorical, Field(discriminator="type")]


class Search(StrEnum):
    grid = "grid"  # every point of the space once (parameters with values or a step)
    random = "random"  # independent draws, fixed by the seed
    tpe = "tpe"  # Optuna's Tree-structured Parzen Estimator: draws where good trials were


class Mode(StrEnum):
    min = "min"  # lower is better (a loss)
    max = "max"  # higher is better (an accuracy)


class Resource(StrEnum):
    epoch = "epoch"  # a trial's budget is counted in epochs (the recipes' val/ metrics)
    step = "step"  # in training steps (a script that reports per step)


class _Pruner(BaseModel):
    model_config = ConfigDict(extra="forbid")
    resource: Resource = Field(
        Resource.epoch, description="What a trial's progress is counted in for pruning."
    )


class AshaPruner(_Pruner):
    """Asynchronous successive halving: at each rung, only the best 1/reduction_factor go on."""

    type: Literal["asha"]
    min_resource: Int = Field(1, ge=1, le=1_000_000)
    reduction_factor: Int = Field(3, ge=2, le=100)
    min_early_stopping_rate: Int = Field(0, ge=0, le=100)


class HyperbandPruner(_Pruner):
    """Hyperband: several successive-halving brackets of different aggressiveness."""

    type: Literal["hyperband"]
    min_resource: Int = Field(1, ge=1, le=1_000_000)
    max_resource: IntOrNone = Field(
        None, ge=1, le=1_000_000, description="A trial's whole budget; default: the job's epochs."
    )
    reduction_factor: Int = Field(3, ge=2, le=100)


class MedianPruner(_Pruner):
    """Stop a trial whose value is worse than the median of earlier trials at that point."""

    type: Literal["median"]
    n_startup_trials: Int = Field(5, ge=0, le=MAX_TRIALS)
    n_warmup_steps: Int = Field(0, ge=0, le=1_000_000)
    interval_steps: Int = Field(1, ge=1, le=1_000_000)


Pruner = Annotated[AshaPruner | HyperbandPruner | MedianPruner, Field(discriminator="type")]


SWEEP_EXAMPLE: dict[str, Any] = {
    "name": "lr-width",
    "job": {"recipe": "mlp-classifier", "epochs": 9, "accelerator": "cpu"},
    "parameters": {
        "lr": {"type": "float", "low": 1e-4, "high": 0.3, "log": True},
        "params.hidden": {"type": "categorical", "values": [32, 64, 128]},
        "batch_size": {"type": "int", "low": 32, "high": 256, "step": 32},
    },
    "search": "tpe",
    "seed": 0,
    "metric": "val/loss",
    "mode": "min",
    "max_trials": 20,
    "max_parallel": 4,
    "pruner": {"type": "asha", "min_resource": 1, "reduction_factor": 3},
}


class SweepCreate(SQLModel):
    """A sweep as submitted; unknown fields are refused."""

    model_config = ConfigDict(  # type: ignore[assignment]
        extra="forbid", json_schema_extra={"examples": [SWEEP_EXAMPLE]}
    )

    name: NulFreeStr | None = Field(None, max_length=100, description="A label for people.")
    job: JobCreate = Field(description="The job spec every trial starts from.")
    parameters: dict[ParameterName, Parameter] = Field(
        min_length=1,
        max_length=MAX_PARAMETERS,
        description="What to search: a job field (lr, batch_size, params.X …), or for a "
        "script a {name} its entrypoint holds.",
    )
    search: Search = Field(Search.random, description="How trials' values are chosen.")
    seed: Int = Field(0, ge=0, le=2**31 - 1, description="Same sweep + seed => same draws.")
    metric: NulFreeStr = Field(
        max_length=100, description="The metric that ranks trials (and prunes), e.g. val/loss."
    )
    mode: Mode = Field(Mode.min, description="Whether lower or higher values of it are better.")
    max_trials: IntOrNone = Field(
        None, ge=1, le=MAX_TRIALS, description="Trials in all; default for grid: its size."
    )
    max_parallel: Int = Field(4, ge=1, le=MAX_PARALLEL, description="Trials unfinished at once.")
    pruner: Pruner | None = Field(None, description="Stops trials that fall behind; none: off.")


class SweepStatus(StrEnum):
    running = "running"  # trials are being started and watched
    finished = "finished"  # every trial it asked for has ended
    cancelled = "cancelled"  # cancelled on request; its unfinished trials were cancelled
    failed = "failed"  # stopped: its first trials all failed, none succeeded


class TrialState(StrEnum):
    running = "running"  # its job has not ended (queued, running, cancelling)
    complete = "complete"  # its job succeeded and reported the metric
    pruned = "pruned"  # stopped by the pruner
    failed = "failed"  # its job failed, was cancelled by a person, or never reported


class Sweep(SQLModel, table=True):
    """A sweep's row: its spec, status, and which process drives it (a fenced lease)."""

    __tablename__ = "sweep"
    __table_args__ = (Index("ix_sweep_status", "status", "id"),)

    id: int | None = Field(default=None, primary_key=True)
    owner: str = Field(max_length=USER_NAME_MAX, index=True)
    name: str | None = Field(None, max_length=100)
    spec: dict[str, Any] = Field(sa_type=JSON)  # SweepCreate, as JSON
    status: SweepStatus = Field(SweepStatus.running, sa_type=EnumAsString(SweepStatus))
    reason_code: str | None = Field(None, max_length=32)
    reason_message: str | None = Field(None, max_length=2000)
    # The driver that holds it: at most one process asks for, prunes and records trials.
    driver_id: str | None = Field(None, max_length=200)
    lease_token: str | None = Field(None, max_length=64)
    lease_expires_at: datetime | None = Field(None, sa_type=UTCDateTime)
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    finished_at: datetime | None = Field(None, sa_type=UTCDateTime)


class SweepTrial(SQLModel, table=True):
    """One trial: its number in the sweep, its job, the values it tries, how it ended.
    (sweep, number) is unique, so a trial is never started twice."""

    __tablename__ = "sweep_trial"

    sweep_id: int = Field(foreign_key="sweep.id", primary_key=True)
    number: int = Field(primary_key=True)
    # None for a trial whose values made a spec no worker could run (``message`` says)
    job_id: int | None = Field(None, foreign_key="job.id", unique=True)
    values: dict[str, Any] = Field(sa_type=JSON)
    # What Optuna's sampler noted on the trial (the grid's point): a restarted driver
    # rebuilds the study with it, so a grid's points are each run once.
    system_attrs: dict[str, Any] = Field(default_factory=dict, sa_type=JSON)
    state: TrialState = Field(TrialState.running, sa_type=EnumAsString(TrialState))
    value: float | None = None  # the objective Optuna was told, once ended
    ended_at: datetime | None = Field(None, sa_type=UTCDateTime)
    message: str | None = Field(None, max_length=2000)


class TrialRead(SQLModel):
    number: int = Field(description="0, 1, … in the order trials were started.")
    job_id: int | None = Field(description="Its job (None: its spec was refused, see reason).")
    values: dict[str, Any] = Field(description="The parameters' values this trial tries.")
    status: JobStatus = Field(description="Its job's status.")
    pruned: bool = Field(description="Stopped by the pruner (its job: cancelled, pruned).")
    reason: Reason | None = None
    last: float | None = Field(
        None, description="The sweep metric's last value: what trials are ranked by."
    )
    best: float | None = Field(
        None, description="Its best value over the trial's run (min or max, by mode)."
    )
    step: int | None = Field(None, description="The step of its last point of the metric.")
    progress: Progress | None = None


class SweepCounts(SQLModel):
    queued: int = 0
    running: int = 0  # running or cancelling
    succeeded: int = 0
    failed: int = 0
    cancelled: int = 0  # by a person (or the sweep's cancel), not pruned
    pruned: int = 0
    total: int = 0


class SweepRead(SQLModel):
    id: int
    name: str | None
    owner: str
    status: SweepStatus
    reason: Reason | None = None
    spec: dict[str, Any] = Field(description="As submitted, defaults filled in.")
    counts: SweepCounts
    best: TrialRead | None = Field(None, description="The best finished trial so far.")
    trials: list[TrialRead] = Field(default_factory=list)
    created_at: datetime
    finished_at: datetime | None = None


class SweepList(SQLModel):
    items: list[SweepRead] = Field(description="Each without its trials (GET one for them).")
    total: int
    limit: int
    offset: int
