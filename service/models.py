"""Database tables (SQLModel) and the API schemas users see in Swagger.

One family of classes per entity (``JobBase``, ``JobCreate``, ``Job``, ``JobRead``,
``JobList``; metrics, log lines, workers, recipes): the table and the schemas built on
it read best side by side, which keeps this module past the ~300 lines others keep.
"""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, ConfigDict, StrictBool, StringConstraints
from pydantic_core import PydanticCustomError
from sqlalchemy import JSON, DateTime, Index, Row, String, TypeDecorator, column, desc, text
from sqlmodel import Field, SQLModel

from service.points import finite

# The widest integers the columns hold: INTEGER is 32 bits on PostgreSQL (ids, steps,
# event numbers, spec fields), and nothing in SQLite is wider than 64. Every integer that
# comes in is bounded by one of these (or tighter), so none reaches the database too wide.
MAX_INT32 = 2**31 - 1
MAX_INT64 = 2**63 - 1


# No NUL character: PostgreSQL's text refuses one (an INSERT that holds it fails whole),
# and no file name or program argument can carry one. A pattern, not a validator
# function, so a field's own max_length stays a string's ("at most 100 characters").
NUL_FREE_PATTERN = r"^[^\x00]*$"


def refuse_unstorable(value: Any) -> Any:
    """A JSON value, unless a string in it (keys included, at any depth) holds a NUL or a
    number in it is not finite (Python's json reads NaN and Infinity; JSON has neither)."""
    if isinstance(value, str):
        if "\x00" in value:
            raise ValueError("no string in it may contain a NUL character (\\u0000)")
    elif isinstance(value, float):
        if finite(value) is None:
            raise ValueError("no number in it may be NaN or infinite")
    elif isinstance(value, dict):
        for key, item in value.items():
            refuse_unstorable(key)
            refuse_unstorable(item)
    elif isinstance(value, list):
        for item in value:
            refuse_unstorable(item)
    return value


# Every string that comes in, in a body, path or query: no NUL character.
NulFreeStr = Annotated[str, StringConstraints(pattern=NUL_FREE_PATTERN)]
# A JSON object that comes in (a recipe's params): no NUL in its strings, numbers finite.
JsonObject = Annotated[dict[str, Any], AfterValidator(refuse_unstorable)]

# A blob's name: the SHA-256 of its bytes.
DIGEST_PATTERN = r"^sha256:[0-9a-f]{64}$"
DIGEST_MAX = len("sha256:") + 64
Digest = Annotated[str, StringConstraints(pattern=DIGEST_PATTERN)]  # no NUL in it
# A data file's name under $TRAINYARD_INPUT_DIR: one plain file name, not hidden.
DataName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,199}$")]
Argument = Annotated[NulFreeStr, StringConstraints(max_length=10_000)]
Requirement = Annotated[NulFreeStr, StringConstraints(min_length=1, max_length=1000)]


def _json_number(error_type: str, words: str) -> BeforeValidator:
    """Lets only a JSON number through (``words``: "an integer", "a number"), as JSON
    Schema has it: true and false are none, though pydantic's lax mode reads them as 1
    and 0 (a spec with "devices": true asked for one device), and neither is a string of
    digits. A whole float (2.0) is an integer, as the schema says."""

    def number(value: Any) -> Any:
        if isinstance(value, bool | str | bytes):
            given = "a boolean" if isinstance(value, bool) else "a string"
            raise PydanticCustomError(error_type, f"Input should be {words}, not {given}")
        return value

    return BeforeValidator(number)


# Every integer and number that comes in, in a body: what the schema says, and no other.
# (An optional one's validator holds the whole union: ``Int | None`` would publish its
# Field's bounds as "ge" and "le", which JSON Schema does not know, not as its limits.)
Int = Annotated[int, _json_number("int_type", "an integer")]
IntOrNone = Annotated[int | None, _json_number("int_type", "an integer")]
Number = Annotated[float, _json_number("float_type", "a number")]
NumberOrNone = Annotated[float | None, _json_number("float_type", "a number")]


def utcnow() -> datetime:
    """The current time, timezone-aware UTC."""
    return datetime.now(UTC)


# The user every request acts as without a token of a user's own: the bootstrap admin
# token (TRAINYARD_API_TOKEN), or no token where the server has none (loopback only).
BOOTSTRAP_USER = "admin"
MAX_NODES = 64  # boxes one job may span
USER_NAME_MAX = 64
# A user's fair-share score before any usage (service.fair_share): below every real one.
NO_USAGE = -1e300


class UTCDateTime(TypeDecorator[datetime]):
    """Stores naive UTC (portable across SQLite and PostgreSQL), returns aware UTC."""

    impl = DateTime
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is not None and value.tzinfo is not None:
            value = value.astimezone(UTC).replace(tzinfo=None)
        return value

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        return value.replace(tzinfo=UTC) if value is not None else None


class JobStatus(StrEnum):
    queued = "queued"  # waiting for a worker with enough free devices
    running = "running"  # a worker holds the lease and its runner trains the job
    cancelling = "cancelling"  # cancel asked while running; the worker is stopping it
    succeeded = "succeeded"  # trained to the last epoch; artifacts written
    failed = "failed"  # ended by an error, with no attempt left or none worth making
    cancelled = "cancelled"  # stopped on request


class Strategy(StrEnum):
    auto = "auto"  # ddp when devices > 1, else single
    single = "single"  # one process, one device
    dp = "dp"  # torch.nn.DataParallel over the job's GPUs in one process
    ddp = "ddp"  # DistributedDataParallel, one process per device via mp.spawn


class Accelerator(StrEnum):
    auto = "auto"  # cuda when the worker has GPUs
    cuda = "cuda"
    cpu = "cpu"


class Optimizer(StrEnum):
    adamw = "adamw"
    sgd = "sgd"


class Precision(StrEnum):
    fp32 = "fp32"
    bf16 = "bf16"


class EnumAsString(TypeDecorator[StrEnum]):
    """Stores an enum as its value in VARCHAR(16): portable, and new members need no migration."""

    impl = String(16)
    cache_ok = True

    def __init__(self, enum: type[StrEnum]) -> None:
        super().__init__()
        self.enum = enum

    def process_bind_param(self, value: Any, dialect: Any) -> str | None:
        return None if value is None else self.enum(value).value

    def process_result_value(self, value: Any, dialect: Any) -> StrEnum | None:
        return None if value is None else self.enum(value)


class JobBase(SQLModel):
    """The job spec: what to train and how."""

    name: NulFreeStr | None = Field(None, max_length=100, description="A label for people.")
    recipe: NulFreeStr | None = Field(
        None,
        max_length=100,
        description="A registered recipe, see GET /api/v1/recipes; or leave it out and "
        "give code and entrypoint to run your own script.",
    )
    params: JsonObject = Field(
        default_factory=dict,
        sa_type=JSON,
        description="The recipe's own parameters, validated by its JSON schema.",
    )
    code: Digest | None = Field(  # (SQLModel's regex= was never checked: the type is)
        None,
        max_length=DIGEST_MAX,
        description="A code package (zip) stored with PUT /api/v1/blobs/{digest}: a script "
        "job's working directory.",
    )
    entrypoint: list[Argument] | None = Field(
        None,
        sa_type=JSON(none_as_null=True),
        min_length=1,
        max_length=1000,
        description='What a script job runs in its package, e.g. ["python", "train.py", '
        '"--epochs", "3"]. ddp starts it once per device through torchrun.',
    )
    data: dict[DataName, Digest] | None = Field(
        None,
        sa_type=JSON(none_as_null=True),
        max_length=100,
        description="Blobs a script job reads, each placed read-only at "
        '$TRAINYARD_INPUT_DIR/<name>: {"digits.npz": "sha256:..."}.',
    )
    requirements: list[Requirement] | None = Field(
        None,
        sa_type=JSON(none_as_null=True),
        max_length=500,
        description="pip requirement lines, installed into a virtualenv on the worker's own "
        "packages (torch is never reinstalled); default: the package's requirements.txt.",
    )
    strategy: Strategy = Field(
        Strategy.auto,
        sa_type=EnumAsString(Strategy),
        description="auto: ddp when devices > 1, else single.",
    )
    devices: Int = Field(
        1, ge=1, le=1024, description="GPUs for the job; on CPU, processes for ddp."
    )
    nodes: Int = Field(
        1,
        ge=1,
        le=MAX_NODES,
        description="Boxes the job spans (ddp only, workers sharing a PostgreSQL database): "
        "it starts when this many workers each have `devices` free, and trains on "
        "nodes x devices ranks.",
    )
    accelerator: Accelerator = Field(
        Accelerator.auto,
        sa_type=EnumAsString(Accelerator),
        description="auto: cuda when the worker has GPUs.",
    )
    gpu_memory_gb: NumberOrNone = Field(
        None,
        gt=0,
        le=4096,
        description="Part of one GPU instead of a whole one: GiB of its memory (with "
        "devices: 1). Jobs asking for shares are packed onto GPUs by their free memory, "
        "each one's allocator capped at what it asked; a job past its share fails with "
        "an out-of-memory reason, not its neighbours.",
    )
    epochs: Int = Field(1, ge=1, le=100_000)
    batch_size: Int = Field(
        64, ge=1, le=1_000_000, description="The global batch; ddp gives each rank batch/devices."
    )
    lr: Number = Field(1e-3, gt=0, le=10, description="Learning rate.")
    optimizer: Optimizer = Field(Optimizer.adamw, sa_type=EnumAsString(Optimizer))
    seed: Int = Field(0, ge=0, le=2**31 - 1, description="Same spec + seed => same weights.")
    precision: Precision = Field(Precision.fp32, sa_type=EnumAsString(Precision))
    priority: Int = Field(0, ge=-100, le=100, description="Higher runs first.")
    preemptible: StrictBool = Field(
        True,
        description="false: never stopped to make room for another job (only an admin may "
        "submit such a job).",
    )
    max_attempts: Int = Field(
        3,
        ge=1,
        le=10,
        description="Attempts in all. A failure that is not the job's fault (a lost worker "
        "or node, a runner killed from outside, preemption, a database outage) is retried "
        "until they are spent; the job's own failure only as retries_on_error allows.",
    )
    retries_on_error: Int = Field(
        0,
        ge=0,
        le=9,
        description="How many times the job's own failure (a script's non-zero exit, an "
        "exception in a recipe) is retried, within max_attempts. 0: it fails at once, since "
        "the same code on the same data fails again.",
    )
    timeout_s: IntOrNone = Field(
        None, ge=1, le=365 * 24 * 3600, description="Wall-clock limit per attempt."
    )
    checkpoint_every: Int = Field(1, ge=1, le=100_000, description="Checkpoint every N epochs.")


JOB_EXAMPLE: dict[str, Any] = {
    "name": "ddp smoke test",
    "recipe": "mlp-regression",
    "params": {"hidden": 64},
    "strategy": "ddp",
    "devices": 2,
    "accelerator": "cpu",
    "epochs": 5,
    "batch_size": 64,
    "lr": 0.001,
}


SCRIPT_EXAMPLE: dict[str, Any] = {
    "name": "my own DDP script",
    "code": "sha256:" + "0" * 64,
    "entrypoint": ["python", "train.py", "--epochs", "3"],
    "data": {"digits.npz": "sha256:" + "1" * 64},
    "strategy": "ddp",
    "devices": 2,
}


class JobCreate(JobBase):
    """A job as submitted; unknown fields are refused."""

    model_config = ConfigDict(  # type: ignore[assignment]
        extra="forbid", json_schema_extra={"examples": [JOB_EXAMPLE]}
    )


# The predicate of the queue's partial indexes. A query is served by them only if its own
# text says ``status = 'queued'`` (a bound parameter would not prove it), so the store
# spells the same literal (``service.store.tables.queued``).
QUEUED_ONLY: dict[str, Any] = {
    f"{dialect}_where": text("status = 'queued'") for dialect in ("sqlite", "postgresql")
}
# Queued jobs across boxes (service.store.gang's look at the queue): as few as there are.
QUEUED_ACROSS_BOXES: dict[str, Any] = {
    f"{dialect}_where": text("status = 'queued' AND nodes > 1")
    for dialect in ("sqlite", "postgresql")
}


class Job(JobBase, table=True):
    """A job row: the spec plus its place in the lifecycle."""

    __tablename__ = "job"
    __table_args__ = (
        # The queue, as partial indexes that hold queued jobs only: the claim's order
        # (priority DESC, id ASC), so a claim reads one index entry instead of sorting the
        # queue, and age (id), for the starvation check's oldest queued job. A job leaves
        # them when claimed, so they stay the size of the queue, not of the history, and
        # no planner statistics can make a claim walk past the jobs already taken.
        Index("ix_job_claim", desc(column("priority")), "id", **QUEUED_ONLY),
        Index("ix_job_queued_id", "id", **QUEUED_ONLY),
        # Jobs across boxes, in the same order: a worker's look for a gang to join reads
        # only those, however many one-box jobs are queued.
        Index("ix_job_gang", desc(column("priority")), "id", **QUEUED_ACROSS_BOXES),
        # Fair share's: each user's queue in the claim's order; and a user's jobs by
        # status (their running devices, their queued count, "my jobs").
        Index("ix_job_owner_claim", "owner", desc(column("priority")), "id", **QUEUED_ONLY),
        Index("ix_job_owner_status", "owner", "status"),
        # The listing's (newest first, by status).
        Index("ix_job_status_id", "status", "id"),
        Index("ix_job_worker", "worker_id", "status"),
        # An Idempotency-Key is its owner's: two users' equal keys are two jobs.
        Index("ux_job_owner_idempotency_key", "owner", "idempotency_key", unique=True),
        # A sweep's trials (GET /jobs?sweep=ID, the sweep's page and its driver).
        Index("ix_job_sweep", "sweep_id"),
    )

    id: int | None = Field(default=None, primary_key=True)
    # Who submitted it (a user's name): set by the API from the request's token.
    owner: str = Field(BOOTSTRAP_USER, max_length=USER_NAME_MAX)
    status: JobStatus = Field(JobStatus.queued, sa_type=EnumAsString(JobStatus))
    reason_code: str | None = Field(None, max_length=32)
    reason_message: str | None = Field(None, max_length=2000)
    attempt: int = 1
    progress: dict[str, Any] | None = Field(None, sa_type=JSON)
    # One counter per job numbers everything a watcher can see (status changes, progress,
    # metric points, log lines), taken in the transaction that writes them, under the job
    # row's lock: the event stream resumes from a number with no gap and no duplicate.
    event_seq: int = 1
    status_seq: int = 1  # number of the latest status change
    progress_seq: int = 0  # number of the latest progress
    # The per-job log bound: lines stored, lines dropped, and the line that says so.
    log_count: int = 0
    log_dropped: int = 0
    log_marker_seq: int | None = None
    error: dict[str, Any] | None = Field(None, sa_type=JSON)
    result: dict[str, Any] | None = Field(None, sa_type=JSON)
    environment: dict[str, Any] | None = Field(None, sa_type=JSON)
    worker_id: str | None = Field(None, max_length=200)
    lease_token: str | None = Field(None, max_length=64)
    lease_expires_at: datetime | None = Field(None, sa_type=UTCDateTime)
    assigned_devices: list[int] | None = Field(None, sa_type=JSON)
    runner_pgid: int | None = None
    # The executor's own name for the running attempt: Slurm's job id (workers.slurm);
    # None on a box, whose attempt is its runner's process group.
    executor_id: str | None = Field(None, max_length=64)
    run_after: datetime | None = Field(None, sa_type=UTCDateTime)
    # When it was last stopped to make room for another job: not again for a while.
    preempted_at: datetime | None = Field(None, sa_type=UTCDateTime)
    # The attempt that was: every node of a job across boxes sees it as its lease renews,
    # and stops with the rest of its gang.
    preempted_attempt: int | None = None
    idempotency_key: str | None = Field(None, max_length=200)
    # The sweep it is a trial of (service.sweeps); None for a job submitted on its own.
    # (no foreign key: adding one to SQLite's job table would copy the whole table)
    sweep_id: int | None = None
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    started_at: datetime | None = Field(None, sa_type=UTCDateTime)
    finished_at: datetime | None = Field(None, sa_type=UTCDateTime)


# A job as read: the ORM object, or a row of the job table (its columns as attributes).
# The API reads rows: building a Job costs more than the query that fetched it.
JobLike = Job | Row[Any]


class Reason(SQLModel):
    code: str = Field(description="Machine-readable, e.g. no_worker, worker_lost, error.")
    message: str = Field(description="A sentence for people.")


class Progress(SQLModel):
    epoch: int = 0
    epochs: int = 0
    step: int = 0
    total_steps: int = 0
    loss: float | None = None
    samples_per_s: float | None = None
    eta_s: float | None = None


class JobNodeRead(SQLModel):
    node: int
    worker_id: str
    devices: list[int]


class JobRead(JobBase):
    """A job as the API shows it."""

    # None of the job table's bookkeeping columns (lease, fence, event counters,
    # idempotency key) is a field here: from_row leaves them out.

    id: int
    owner: str = Field(description="The user who submitted it.")
    status: JobStatus
    reason: Reason | None = None
    attempt: int
    progress: Progress | None = None
    error: dict[str, Any] | None = Field(
        None,
        description="The last failure: type, message, traceback tail; own_failures: how many "
        "attempts failed by the job's own code (see retries_on_error).",
    )
    result: dict[str, Any] | None = Field(None, description="Final metrics of a finished job.")
    environment: dict[str, Any] | None = Field(
        None,
        description="Reproducibility record of the latest attempt: resolved spec and seed, "
        "Python/torch/CUDA/cuDNN/NCCL versions, GPUs and driver, host, worker, "
        "installed-packages hash, recipe source hash.",
    )
    worker_id: str | None = None
    assigned_devices: list[int] | None = None
    node_list: list[JobNodeRead] | None = Field(
        None,
        description="A multi-node job: the workers and devices each of its nodes holds "
        "(joined while it waits for the rest, held while it runs).",
    )
    queue_position: int | None = Field(None, description="1 = next to run (queued jobs only).")
    sweep_id: int | None = Field(None, description="The sweep it is a trial of, if any.")
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None

    @classmethod
    def from_row(cls, job: JobLike, queue_position: int | None = None) -> JobRead:
        # Validated from a dict: half the time of reading a row's attributes (a listing
        # builds fifty of these); columns that are not fields here are ignored.
        data = dict(job._mapping) if isinstance(job, Row) else job.model_dump()
        if job.reason_code:
            data["reason"] = {"code": job.reason_code, "message": job.reason_message or ""}
        data["queue_position"] = queue_position
        return cls.model_validate(data)


class JobList(SQLModel):
    items: list[JobRead]
    total: int = Field(description="Jobs matching the filter, all pages.")
    limit: int
    offset: int


class Metric(SQLModel, table=True):
    """One point of a job's time series; unique per (job, name, step) so resumes add none."""

    __tablename__ = "metric"
    __table_args__ = (Index("ix_metric_job_seq", "job_id", "seq"),)

    job_id: int = Field(foreign_key="job.id", primary_key=True, ondelete="CASCADE")
    name: str = Field(primary_key=True, max_length=100)
    step: int = Field(primary_key=True)
    epoch: int
    # None: the value was not finite (NaN, inf); stored so the series shows the gap
    value: float | None
    time: float = Field(description="Unix seconds.")
    seq: int = Field(description="The job's event number, for the event stream.")


class MetricRead(SQLModel):
    step: int
    epoch: int
    name: str
    value: float | None = Field(description="null where the value was NaN or infinite.")
    time: float


class LogLine(SQLModel, table=True):
    """One line a job's processes printed, numbered per job."""

    __tablename__ = "log_line"

    job_id: int = Field(foreign_key="job.id", primary_key=True, ondelete="CASCADE")
    seq: int = Field(primary_key=True)
    time: float
    stream: str = Field(max_length=8, description="stdout, stderr or system")
    text: str


class LogLineRead(SQLModel):
    seq: int
    time: float
    stream: str
    text: str


class User(SQLModel, table=True):
    """Someone who submits jobs: their quotas and their fair-share usage."""

    __tablename__ = "trainyard_user"  # "user" is a reserved word in PostgreSQL
    __table_args__ = (Index("ix_user_usage", "usage_score", "name"),)

    name: str = Field(primary_key=True, max_length=USER_NAME_MAX)
    admin: bool = False
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    # Quotas of their own (None: the settings' defaults).
    max_running_devices: int | None = None
    max_queued_jobs: int | None = None
    # Fair share: their decayed device-seconds, as a score the claim can order by without
    # arithmetic (see service.fair_share); NO_USAGE until their first job ran.
    usage_score: float = NO_USAGE


class ApiToken(SQLModel, table=True):
    """A user's API token: only its hash is kept; the prefix tells tokens apart."""

    __tablename__ = "api_token"

    id: int | None = Field(default=None, primary_key=True)
    user_name: str = Field(foreign_key="trainyard_user.name", max_length=USER_NAME_MAX, index=True)
    prefix: str = Field(max_length=16)
    token_hash: str = Field(max_length=64, unique=True)  # sha256, hex
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    expires_at: datetime | None = Field(None, sa_type=UTCDateTime)
    revoked_at: datetime | None = Field(None, sa_type=UTCDateTime)


class AuditEvent(SQLModel, table=True):
    """Who did what, when: submits, cancels, reruns, preemptions, tokens and users."""

    __tablename__ = "audit_event"

    id: int | None = Field(default=None, primary_key=True)
    at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    actor: str = Field(max_length=USER_NAME_MAX)
    action: str = Field(max_length=32)
    target: str = Field(max_length=200)
    detail: dict[str, Any] | None = Field(None, sa_type=JSON)


class JobNode(SQLModel, table=True):
    """One worker's place in a multi-node job (``nodes`` > 1): the gang it forms with
    the others before the job starts, and holds while it runs (service.store.gang)."""

    __tablename__ = "job_node"

    job_id: int = Field(primary_key=True)
    node: int = Field(primary_key=True, description="0 .. nodes-1: the order they joined")
    worker_id: str = Field(max_length=200, index=True)
    devices: list[int] = Field(default_factory=list, sa_type=JSON)
    # Where this node would serve the rendezvous (node 0's is the job's): address:port.
    endpoint: str = Field(max_length=300)
    joined_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    renewed_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    # Set when this node's ranks ended well: it no longer renews, and is not lost.
    done_at: datetime | None = Field(None, sa_type=UTCDateTime)
    runner_pgid: int | None = None


class Worker(SQLModel, table=True):
    """A worker process on a box, with its devices and the recipes it can run."""

    __tablename__ = "worker"

    id: str = Field(primary_key=True, max_length=200)
    hostname: str = Field(max_length=255)
    pid: int
    accelerator: str = Field(max_length=8, description="cuda or cpu")
    devices: list[dict[str, Any]] = Field(default_factory=list, sa_type=JSON)
    recipes: list[dict[str, Any]] = Field(default_factory=list, sa_type=JSON)
    # recipe sources the worker skipped: {"source": file or entry point, "error": one line}
    recipe_errors: list[dict[str, str]] = Field(default_factory=list, sa_type=JSON)
    # whether it joins jobs across boxes (it has SHARED_DIR or STORAGE_URL, on PostgreSQL)
    across_boxes: bool = False
    # "box": it runs jobs on its own devices; "slurm": it submits them to a Slurm
    # cluster (workers.slurm), which places them on up to max_nodes nodes
    executor: str = Field(default="box", max_length=16, sa_column_kwargs={"server_default": "box"})
    max_nodes: int = Field(default=1, sa_column_kwargs={"server_default": "1"})
    # what protects the box from its jobs (workers.supervisor.walls); None: not said
    job_walls: dict[str, str] | None = Field(default=None, sa_type=JSON)
    # its cache of packages, virtualenvs and blobs: size, budget, the disk's free space,
    # and why it takes no job when that is low (workers.supervisor's cache upkeep)
    cache: dict[str, Any] | None = Field(default=None, sa_type=JSON)
    started_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    heartbeat_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    stopped_at: datetime | None = Field(default=None, sa_type=UTCDateTime)


class WorkerRead(SQLModel):
    id: str
    hostname: str
    pid: int
    accelerator: str
    devices: list[dict[str, Any]] = Field(
        description="Each device: index, name, memory_mb; on GPUs also NVML's latest "
        "sample (utilization_percent, memory_used_bytes, memory_total_bytes) and "
        "job_memory_bytes: job id -> bytes its processes use there (jobs sharing a GPU)."
    )
    alive: bool
    heartbeat_age_s: float
    running_jobs: dict[int, list[int]] = Field(description="job id -> device indices it holds")
    across_boxes: bool = Field(
        False, description="Whether it takes part in jobs across boxes (nodes > 1)."
    )
    executor: str = Field(
        "box",
        description="'box': it runs jobs on its own devices; 'slurm': it submits them to a "
        "Slurm cluster, which places them.",
    )
    max_nodes: int = Field(1, description="The most nodes one job may span through it.")
    recipe_errors: list[dict[str, str]] = Field(
        default_factory=list,
        description="Recipe files (or entry points) the worker skipped because they failed "
        "to load, each with its error in one line; it runs the others.",
        schema_extra={
            "examples": [[{"source": "/recipes/mine.py", "error": "SyntaxError: invalid syntax"}]]
        },
    )
    job_walls: dict[str, str] | None = Field(
        None,
        description="What keeps its jobs from the box: runs_jobs_as (the account a job's "
        "processes run as), job_network ('isolated': a one-box job has a network of its "
        "own, loopback only; 'shared': the box's, with job_network_why).",
        schema_extra={"examples": [{"runs_jobs_as": "trainyard-job", "job_network": "isolated"}]},
    )
    cache: dict[str, Any] | None = Field(
        None,
        description="Its cache of code packages, fetched blobs and virtualenvs: size_bytes "
        "and entries (as of its last sweep), budget_bytes (TRAINYARD_CACHE_BUDGET_GB: past "
        "it the least recently used entries no running job uses are evicted), "
        "disk_free_bytes and min_free_bytes (TRAINYARD_MIN_FREE_DISK_GB), and refusing: "
        "why it takes no job now (its disk nearly full), else null.",
        schema_extra={
            "examples": [
                {
                    "size_bytes": 3_221_225_472,
                    "budget_bytes": 21_474_836_480,
                    "entries": 12,
                    "disk_free_bytes": 85_899_345_920,
                    "min_free_bytes": 2_147_483_648,
                    "refusing": None,
                }
            ]
        },
    )
    started_at: datetime


class RecipeRead(SQLModel):
    name: str
    summary: str
    params_schema: dict[str, Any]
    source_hash: str
    metrics: list[str] | None = Field(
        None, description="The metrics it reports (None: not said: a sweep may name any)."
    )
    workers: list[str]
