"""The API's schemas, as the client reads them: the same names and fields as the
server's OpenAPI components (a test holds them equal), typed, without the server's
validation. Unknown fields are ignored, so a newer server's additions break no client.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field

T = TypeVar("T")


class Model(BaseModel):
    model_config = ConfigDict(extra="ignore")


class JobStatus(StrEnum):
    queued = "queued"  # waiting for a worker with enough free devices
    running = "running"  # a worker holds the lease and its runner trains the job
    cancelling = "cancelling"  # cancel asked while running; the worker is stopping it
    succeeded = "succeeded"  # trained to the last epoch; artifacts written
    failed = "failed"  # ended by an error, with no attempt left or none worth making
    cancelled = "cancelled"  # stopped on request

    @property
    def finished(self) -> bool:
        return self in (JobStatus.succeeded, JobStatus.failed, JobStatus.cancelled)

    @classmethod
    def _missing_(cls, value: object) -> JobStatus | None:
        return _unknown(cls, value)


class SweepStatus(StrEnum):
    running = "running"  # trials are being started and watched
    finished = "finished"  # every trial it asked for has ended
    cancelled = "cancelled"  # cancelled on request; its unfinished trials were cancelled
    failed = "failed"  # stopped: its first trials all failed, none succeeded

    @classmethod
    def _missing_(cls, value: object) -> SweepStatus | None:
        return _unknown(cls, value)


E = TypeVar("E", bound=StrEnum)


def _unknown(enum: type[E], value: object) -> E | None:
    """A status a newer server has and this client does not know: kept as it is (a member
    of no name in the class), so the answer that holds it still reads."""
    if not isinstance(value, str):
        return None
    member = str.__new__(enum, value)
    member._name_ = member._value_ = value
    return member


class Reason(Model):
    code: str
    message: str


class Progress(Model):
    epoch: int = 0
    epochs: int = 0
    step: int = 0
    total_steps: int = 0
    loss: float | None = None
    samples_per_s: float | None = None
    eta_s: float | None = None


class JobNodeRead(Model):
    node: int
    worker_id: str
    devices: list[int]


class JobRead(Model):
    """A job: its spec, where it stands, and what it produced."""

    id: int
    owner: str
    status: JobStatus
    reason: Reason | None = None
    name: str | None = None
    recipe: str | None = None
    params: dict[str, Any] = Field(default_factory=dict)
    code: str | None = None
    entrypoint: list[str] | None = None
    data: dict[str, str] | None = None
    requirements: list[str] | None = None
    strategy: str = "auto"
    devices: int = 1
    nodes: int = 1
    accelerator: str = "auto"
    gpu_memory_gb: float | None = None
    epochs: int = 1
    batch_size: int = 64
    lr: float = 1e-3
    optimizer: str = "adamw"
    seed: int = 0
    precision: str = "fp32"
    priority: int = 0
    preemptible: bool = True
    max_attempts: int = 3
    retries_on_error: int = 0
    timeout_s: int | None = None
    checkpoint_every: int = 1
    attempt: int = 1
    progress: Progress | None = None
    error: dict[str, Any] | None = None
    result: dict[str, Any] | None = None
    environment: dict[str, Any] | None = None
    worker_id: str | None = None
    assigned_devices: list[int] | None = None
    node_list: list[JobNodeRead] | None = None
    queue_position: int | None = None
    sweep_id: int | None = None
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None


class Page(Model, Generic[T]):
    """One page of a listing: its items and how many match in all."""

    items: list[T]
    total: int
    limit: int
    offset: int


class JobList(Page[JobRead]):
    pass


class MetricRead(Model):
    step: int
    epoch: int
    name: str
    value: float | None  # None where the value was NaN or infinite
    time: float


class LogLineRead(Model):
    seq: int
    time: float
    stream: str  # stdout, stderr or system
    text: str


class ArtifactRead(Model):
    name: str  # its path in the job's folder, e.g. model.safetensors
    size: int


class RecipeRead(Model):
    name: str
    summary: str
    params_schema: dict[str, Any]
    source_hash: str
    metrics: list[str] | None = None
    workers: list[str]


class WorkerRead(Model):
    id: str
    hostname: str
    pid: int
    accelerator: str
    devices: list[dict[str, Any]]
    alive: bool
    heartbeat_age_s: float
    running_jobs: dict[int, list[int]]
    across_boxes: bool = False
    executor: str = "box"
    max_nodes: int = 1
    recipe_errors: list[dict[str, str]] = Field(default_factory=list)
    job_walls: dict[str, str] | None = None
    cache: dict[str, Any] | None = None
    started_at: datetime


class BlobUse(Model):
    job_id: int
    role: str  # "code", or "data:<name>"
    status: JobStatus


class BlobRead(Model):
    digest: str
    size: int
    created_at: datetime
    last_used_at: datetime | None = None
    jobs: list[BlobUse] = Field(default_factory=list)


class BlobList(Model):
    items: list[BlobRead]
    total: int
    limit: int
    offset: int


class Me(Model):
    name: str
    admin: bool


class UserRead(Model):
    name: str
    admin: bool
    created_at: datetime
    max_running_devices: int | None
    max_queued_jobs: int | None


class TokenRead(Model):
    id: int
    user: str
    prefix: str
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None


class TokenCreated(TokenRead):
    token: str  # shown this once, never again


class UserUsageRead(Model):
    name: str
    usage_device_s: float
    running_devices: int
    queued_jobs: int
    max_running_devices: int | None
    max_queued_jobs: int | None


class AuditEvent(Model):
    id: int | None = None
    at: datetime
    actor: str
    action: str
    target: str
    detail: dict[str, Any] | None = None


class AuditPage(Model):
    items: list[AuditEvent]
    total: int
    limit: int
    offset: int


class TrialRead(Model):
    number: int
    job_id: int | None
    values: dict[str, Any]
    status: JobStatus
    pruned: bool
    reason: Reason | None = None
    last: float | None = None
    best: float | None = None
    step: int | None = None
    progress: Progress | None = None


class SweepCounts(Model):
    queued: int = 0
    running: int = 0
    succeeded: int = 0
    failed: int = 0
    cancelled: int = 0
    pruned: int = 0
    total: int = 0


class SweepRead(Model):
    """A sweep: its status, counts, best trial and (read one by one) its trials."""

    id: int
    name: str | None
    owner: str
    status: SweepStatus
    reason: Reason | None = None
    spec: dict[str, Any]
    counts: SweepCounts
    best: TrialRead | None = None
    trials: list[TrialRead] = Field(default_factory=list)
    created_at: datetime
    finished_at: datetime | None = None


class SweepList(Page[SweepRead]):
    pass


class Event(Model):
    """One event of a job's stream: ``kind`` is status, progress, metric, log or end."""

    id: int | None  # resume after it (None: the stream's last, ``end``)
    kind: str
    data: dict[str, Any]

    @property
    def job(self) -> JobRead | None:
        """A ``status`` event's job."""
        return JobRead.model_validate(self.data) if self.kind == "status" else None

    @property
    def metric(self) -> MetricRead | None:
        return MetricRead.model_validate(self.data) if self.kind == "metric" else None

    @property
    def log(self) -> LogLineRead | None:
        return LogLineRead.model_validate(self.data) if self.kind == "log" else None

    @property
    def progress(self) -> Progress | None:
        return Progress.model_validate(self.data) if self.kind == "progress" else None


class DeliveryRead(Model):
    """One event sent (or to be sent) to a webhook."""

    id: int  # also its X-Trainyard-Delivery header: the same on each retry
    event: str
    subject: str  # "job 12", "sweep 3"
    state: str  # pending, delivered or failed
    attempts: int
    last_status_code: int | None = None
    last_error: str | None = None
    created_at: datetime
    next_attempt_at: datetime
    delivered_at: datetime | None = None


class WebhookRead(Model):
    """A webhook (never its secret), with its last deliveries when read alone."""

    id: int
    owner: str
    url: str
    events: list[str]
    format: str  # json or slack
    all_users: bool
    active: bool
    created_at: datetime
    deliveries: list[DeliveryRead] = Field(default_factory=list)


class WebhookCreated(WebhookRead):
    secret: str  # the signing secret: shown in this answer only


class WebhookList(Model):
    items: list[WebhookRead]
    total: int
    limit: int
    offset: int
