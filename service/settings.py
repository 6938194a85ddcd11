"""Operator-facing configuration, read from the environment (prefix ``TRAINYARD_``)."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from service.objects.location import Location

# A token is all that stands between the network and running code on the box.
MIN_TOKEN_CHARS = 16
MAKE_A_TOKEN = "python3 -c 'import secrets; print(secrets.token_urlsafe(32))'"


class Settings(BaseSettings):
    """Everything an operator can set; built where needed, never at import time."""

    # hide_input_in_errors: a refused setting's error must not print the token or the
    # database password it was given.
    model_config = SettingsConfigDict(
        env_prefix="TRAINYARD_", extra="ignore", hide_input_in_errors=True
    )

    database_url: str = Field(
        "sqlite:///./data/trainyard.db",
        description="SQLAlchemy URL; SQLite for one box, postgresql+psycopg:// for several.",
    )
    database_url_file: Path | None = Field(
        None,
        description="A file holding DATABASE_URL (a secret's file, as Docker and systemd "
        "mount them), so no shell or parent process need hold the password.",
    )
    data_dir: Path = Field(Path("./data"), description="Artifacts, checkpoints, runner files.")
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    api_token: str | None = Field(
        None,
        description=f"Bearer token required on /api/v1; at least {MIN_TOKEN_CHARS} characters "
        f"(make one with: {MAKE_A_TOKEN}).",
    )
    api_token_file: Path | None = Field(
        None, description="A file holding API_TOKEN (its first line), instead of the variable."
    )
    allowed_hosts: Annotated[list[str], NoDecode] = Field(
        [],
        description="Host names the API answers to besides the loopback names (always "
        "answered), comma-separated; '*.example.com' matches subdomains, '*' any. Other Host "
        "headers get 400: a web page that rebinds its own name to this box's address (DNS "
        "rebinding) cannot reach the API.",
    )
    metrics_open: bool = Field(
        False,
        description="Serve /metrics without the token (a scraper on a trusted network); by "
        "default it needs the API token when the server has one.",
    )
    recipes_dir: Path | None = Field(None, description="Extra recipes: every .py file here.")
    worker_id: str | None = Field(None, description="Stable worker name; default hostname.")
    cpu_slots: int | None = Field(
        None, ge=1, description="Device slots of a worker without GPUs; default the core count."
    )
    max_log_lines: int = Field(
        100_000,
        ge=100,
        description="Log lines kept per job: the first half and the newest, with a marker "
        "counting the lines dropped between them.",
    )
    max_body_bytes: int = Field(1_000_000, ge=1024, description="Larger requests get 413.")
    access_log: bool = Field(
        True, description="A log line per API request (/metrics counts them either way)."
    )
    max_event_streams_per_user: int = Field(
        16,
        ge=1,
        description="Event streams (GET /jobs/{id}/events) one user may have open at once, "
        "per API process; one more gets 429 with Retry-After.",
    )
    max_event_streams: int = Field(
        512,
        ge=1,
        description="Event streams open at once from all users, per API process; one more "
        "gets 429 with Retry-After.",
    )
    api_workers: int = Field(1, ge=1, le=64, description="API server processes.")

    # Blobs: content-addressed uploads (code packages, data files).
    blobs_dir: Path | None = Field(
        None, description="Where blobs are stored; default <data_dir>/blobs."
    )
    max_blob_bytes: int = Field(
        8 * 2**30, ge=1, description="Bytes: the largest blob PUT /api/v1/blobs accepts."
    )
    max_code_bytes: int = Field(
        100 * 2**20, ge=1, description="Bytes: the largest code package (zip) a job may name."
    )
    max_package_files: int = Field(
        10_000, ge=1, description="Entries: the most a code package may hold."
    )
    max_package_unpacked_bytes: int = Field(
        2**30, ge=1, description="Bytes: a code package's size once unpacked (zip bombs)."
    )
    blob_ttl_s: float = Field(
        7 * 24 * 3600.0,
        gt=0,
        description="Seconds: a blob no job has used this long (and no unfinished job "
        "uses) is removed.",
    )
    blob_sweep_interval_s: float = Field(
        3600.0, gt=0, description="Seconds between the API's sweeps of expired blobs."
    )
    sweep_driver: bool = Field(
        True,
        description="Whether this API process drives sweeps (starts, prunes and records "
        "their trials); several may: each sweep is driven by one at a time.",
    )
    sweep_lease_s: float = Field(
        15.0,
        gt=0,
        le=3600,
        description="Seconds: a sweep whose driver (an API process) stopped renewing its "
        "lease is taken over by another after this (one stopped cleanly hands it back).",
    )

    # Webhooks: sent by each API process's dispatcher (service.webhooks).
    webhook_dispatcher: bool = Field(
        True,
        description="Whether this API process sends webhooks' deliveries; several may: "
        "each delivery is claimed by one at a time.",
    )
    webhook_allow_private_addresses: bool = Field(
        False,
        description="Let webhooks be sent to loopback, private, link-local and other "
        "non-public addresses (receivers on the team's own network). By default a URL "
        "whose host resolves to one is refused, at create and at each delivery.",
    )
    webhook_timeout_s: float = Field(
        10.0,
        gt=0,
        le=300,
        description="Seconds: the longest one delivery attempt may take, connect to last "
        "byte; past it the attempt fails and is retried.",
    )
    webhook_retry_base_s: float = Field(
        5.0,
        gt=0,
        le=3600,
        description="Seconds before a failed delivery is tried again, doubling per attempt "
        "(at most an hour).",
    )
    webhook_max_attempts: int = Field(
        10, ge=1, le=100, description="Attempts per delivery; then it is recorded failed."
    )
    webhook_poll_s: float = Field(
        1.0,
        gt=0,
        le=60,
        description="Seconds between the dispatcher's looks for due deliveries (one indexed "
        "read when there is none).",
    )

    # Script jobs, on the worker.
    api_url: str | None = Field(
        None,
        description="Where a worker fetches blobs it does not have on its own disk (other "
        "boxes); default http://<host>:<port>. Sends api_token when set.",
    )
    cache_dir: Path | None = Field(
        None,
        description="A worker's unpacked code packages, fetched blobs and requirement "
        "virtualenvs; default <data_dir>/cache.",
    )
    cache_budget_gb: float = Field(
        20.0,
        ge=0,
        description="GiB: past this, a worker evicts the cache's least recently used "
        "entries (packages, blobs, virtualenvs), never one a running job uses.",
    )
    min_free_disk_gb: float = Field(
        2.0,
        ge=0,
        description="GiB: a worker whose cache's or data directory's disk has less free "
        "(after evicting what it can) takes no job, and says why on /api/v1/workers.",
    )
    requirements_timeout_s: float = Field(
        900.0, gt=0, description="Seconds: the longest a job's pip install may take."
    )

    # Worker knobs (seconds).
    lease_s: float = Field(
        15.0, gt=0, description="A job whose worker is silent this long goes back to the queue."
    )
    heartbeat_interval_s: float = Field(1.0, gt=0, description="Lease renewal and cancel checks.")
    kill_grace_s: float = Field(10.0, ge=0, description="SIGTERM to SIGKILL of a job's processes.")
    stall_timeout_s: float = Field(
        600.0, gt=0, description="An attempt whose step does not advance this long is ended."
    )
    warm_start: bool = Field(
        True, description="Fork runners from a warm process with torch imported (else spawn)."
    )
    reserve_after_s: float = Field(
        600.0,
        ge=0,
        description="A job queued this long reserves devices: no smaller job overtakes it.",
    )
    fair_share_half_life_s: float = Field(
        7 * 24 * 3600.0,
        ge=60,
        description="Fair share: a user's usage (device-seconds) counts half after this "
        "long; the queue starts the jobs of the user with the least usage first.",
    )
    preempt_after_s: float | None = Field(
        None,
        ge=0,
        description="A job queued this long may preempt running jobs it outranks (of a user "
        "with a quarter of their usage or less, or their own of lower priority): they "
        "checkpoint, stop and requeue without spending an attempt. Default: never.",
    )
    preempt_cooldown_s: float = Field(
        3600.0, ge=0, description="A job preempted is not preempted again for this long."
    )
    max_running_devices_per_user: int | None = Field(
        None,
        ge=1,
        description="Devices one user's jobs may hold at once (a job past it waits, reason "
        "quota); an admin may set a user's own. Default: no limit.",
    )
    max_queued_jobs_per_user: int | None = Field(
        None,
        ge=1,
        description="Jobs one user may have queued (a submit past it is 429); an admin may "
        "set a user's own. Default: no limit.",
    )
    job_memory_fraction: float = Field(
        0.8,
        gt=0,
        le=1,
        description="On a worker without GPUs, the part of the box's memory its jobs share: "
        "each job gets its device slots' part, and an allocation past it fails the job "
        "(out_of_memory) instead of the kernel killing some process.",
    )

    # Object storage: checkpoints and artifacts where every box reaches them.
    storage_url: str | None = Field(
        None,
        description="s3://bucket/prefix: checkpoints are uploaded there as they are written "
        "and a resumed attempt on any box downloads the newest whole one; artifacts land "
        "there and the API serves them; a job across boxes checkpoints there instead of "
        "SHARED_DIR. The endpoint and credentials are boto3's: AWS_ENDPOINT_URL (MinIO, "
        "Ceph), AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, a profile, a role. Unset: "
        "everything stays in DATA_DIR.",
    )
    storage_redirect: bool = Field(
        False,
        description="Answer an artifact download from the store with a redirect to a "
        "presigned URL (clients fetch it from the store itself) instead of streaming it "
        "through the API: for stores the clients reach.",
    )
    storage_link_s: int = Field(
        300, ge=10, le=7 * 24 * 3600, description="How long a presigned artifact URL is good."
    )
    storage_sync_s: float = Field(
        1.0,
        gt=0,
        le=300,
        description="How often a worker looks for new checkpoint files to upload.",
    )
    storage_flush_s: float = Field(
        120.0,
        ge=0,
        le=24 * 3600,
        description="How long an attempt's end waits for its last checkpoint and artifacts "
        "to be uploaded before the job moves on (should the store be unreachable, they stay "
        "on this box's disk only, and the job's log says so).",
    )

    # Jobs across boxes (nodes > 1, workers sharing PostgreSQL): see docs/architecture.md.
    shared_dir: Path | None = Field(
        None,
        description="A folder every box mounts at this path (NFS, ...): where a job across "
        "boxes keeps its checkpoints, so its next attempt resumes on whichever boxes take "
        "it. A worker without it takes no job across boxes.",
    )
    advertise_address: str = Field(
        "127.0.0.1",
        max_length=255,
        description="The address other boxes reach this worker at: a job across boxes "
        "whose first node is here serves its rendezvous on it.",
    )
    socket_ifname: str | None = Field(
        None,
        max_length=64,
        description="The network interface a job across boxes' ranks talk on "
        "(GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME). Default: loopback's while "
        "ADVERTISE_ADDRESS is a loopback address, else torch's own choice.",
    )
    private_network: bool = Field(
        False,
        description="Declares ADVERTISE_ADDRESS's network private though the address is "
        "public: only the GPU boxes reach it (a worker on a public address takes no job "
        "across boxes otherwise: torch's rendezvous runs what it is sent).",
    )
    job_user: str | None = Field(
        None,
        description="The account a job's processes run as, where the worker runs as root "
        "(the image's: trainyard-job): they cannot then read the database, the token or "
        "other jobs' folders. Unset: jobs run as the worker's own account.",
    )
    job_uids: str | None = Field(
        None,
        description="With JOB_USER: a range of uids no account uses ('200000-200063'); "
        "each running attempt then runs as a uid of its own from it (in JOB_USER's "
        "group), so jobs that run at the same time cannot read or trace each other.",
        pattern=r"^\d+-\d+$",
    )
    job_network: Literal["isolated", "host"] = Field(
        "isolated",
        description="isolated: a one-box job's processes get a network of their own with "
        "only loopback (where the box allows it; the worker says at start), so no other "
        "account or job reaches its rendezvous store; host: the box's network (a job that "
        "downloads while it trains).",
    )
    gang_timeout_s: float = Field(
        60.0,
        gt=0,
        description="How long a worker holds its devices for a job across boxes whose "
        "other nodes have not come; then it gives them back (and the rendezvous' limit).",
    )

    # A worker in front of a Slurm cluster (`trainyard worker --executor slurm`): see
    # docs/architecture.md, "Running on Slurm".
    slurm_partition: str | None = Field(
        None, max_length=200, description="sbatch --partition; unset: the cluster's default."
    )
    slurm_account: str | None = Field(None, max_length=200, description="sbatch --account.")
    slurm_qos: str | None = Field(None, max_length=200, description="sbatch --qos.")
    slurm_sbatch_options: str = Field(
        "",
        max_length=2000,
        description="More sbatch options for every job, as a shell would split them "
        "('--constraint=a100 --exclusive').",
    )
    slurm_gpus_per_node: int = Field(
        0,
        ge=0,
        le=64,
        description="GPUs on each node of the partition: a job asks for its devices as "
        "GPUs per node. 0: a CPU partition, where a job's devices are CPUs per node.",
    )
    slurm_gpu_option: Literal["gpus-per-node", "gres"] = Field(
        "gpus-per-node",
        description="How a job asks for its GPUs: --gpus-per-node=N, or --gres=gpu:N for "
        "clusters that configure GPUs as generic resources only.",
    )
    slurm_max_nodes: int = Field(
        2, ge=1, le=4096, description="The most nodes one job may span on the cluster."
    )
    slurm_max_pending: int = Field(
        20,
        ge=1,
        le=10_000,
        description="How many of this worker's jobs may wait in Slurm's queue at once; "
        "past it, jobs wait in Trainyard's, where fair share orders them.",
    )
    slurm_poll_interval_s: float = Field(
        1.0, gt=0, le=60, description="How often the worker asks Slurm how its jobs are."
    )
    slurm_python: str | None = Field(
        None,
        max_length=1000,
        description="The Python (with Trainyard installed) that runs a job on the nodes; "
        "default: the worker's own, which the nodes must see at the same path.",
    )

    @model_validator(mode="before")
    @classmethod
    def _secrets_from_files(cls, data: Any) -> Any:
        """DATABASE_URL and API_TOKEN from their files, when those are given; both a
        file and a value is a mistake, said at start."""
        if not isinstance(data, dict):
            return data
        for name in ("database_url", "api_token"):
            path = data.get(f"{name}_file")
            if not path:
                continue
            if data.get(name):
                raise ValueError(f"set {name} or {name}_file, not both")
            try:
                lines = Path(path).read_text().splitlines()
            except OSError as exc:
                raise ValueError(f"{name}_file: cannot read {path}: {exc.strerror}") from exc
            if not lines or not lines[0].strip():
                raise ValueError(f"{name}_file: {path} is empty")
            # read once: the settings hold the value (copies of them read no file again)
            data = {**data, name: lines[0].strip(), f"{name}_file": None}
        return data

    @field_validator("allowed_hosts", mode="before")
    @classmethod
    def _split_hosts(cls, value: object) -> object:
        if isinstance(value, str):
            value = value.split(",")
        if isinstance(value, list):  # as the Host header's name is compared: "[::1]" is ::1
            return [str(h).strip().lower().strip("[]") for h in value if str(h).strip()]
        return value

    @field_validator("api_token")
    @classmethod
    def _strong_token(cls, value: str | None) -> str | None:
        if value is not None and len(value) < MIN_TOKEN_CHARS:
            raise ValueError(
                f"a token needs at least {MIN_TOKEN_CHARS} characters; "
                f"make one with: {MAKE_A_TOKEN}"
            )
        return value

    @field_validator("storage_url")
    @classmethod
    def _storage_url(cls, value: str | None) -> str | None:
        if not value:
            return None
        return str(Location.parse(value.strip()))

    @property
    def cache_path(self) -> Path:
        """A worker's cache, absolute: CACHE_DIR, else DATA_DIR/cache."""
        return (self.cache_dir or self.data_dir / "cache").resolve()

    @property
    def blobs_path(self) -> Path:
        """The blob store: BLOBS_DIR, else DATA_DIR/blobs."""
        return self.blobs_dir or self.data_dir / "blobs"

    def require_safe_bind(self) -> None:
        """Refuse to serve a non-loopback address, or to any host name, without a token."""
        unsafe = self.unsafe_hosts()
        if unsafe is not None:
            raise SystemExit(unsafe)
        if self.api_token or is_loopback(self.host):
            return
        raise SystemExit(
            f"refusing to listen on {self.host} without TRAINYARD_API_TOKEN: "
            "anyone on the network could run code on this box; set a token or bind 127.0.0.1"
        )

    def unsafe_hosts(self) -> str | None:
        """Why ALLOWED_HOSTS may not be served as set, or None: a wildcard without a token
        lets a page that rebinds its own name to this box pass the Host check, and then
        nothing would stop it."""
        wildcards = [h for h in self.allowed_hosts if h.startswith("*")]
        if not wildcards or self.api_token:
            return None
        return (
            f"refusing TRAINYARD_ALLOWED_HOSTS={','.join(wildcards)} without "
            "TRAINYARD_API_TOKEN: a web page that rebinds its own name to this box "
            "(DNS rebinding) would pass the Host check and could run code here; name "
            "the hosts exactly, or set a token"
        )


def is_loopback(host: str) -> bool:
    """Whether a host name or address is loopback (the API's bind, a worker's advertised
    address)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
