"""The job store: every read and write of a job's row, in one module per concern.

- ``transitions``: the state machine (``ALLOWED_FROM``), the fence, and every status
  change but the claim: cancel, finish, release, requeue with back-off, lost workers.
- ``retries``: the job's own failures, counted against its ``retries_on_error``.
- ``claim``: taking the best queued job that fits (its SQL in one place), the
  attempt's start record and lease renewal.
- ``submit``: new jobs, idempotency keys, the group-committed INSERT.
- ``queries``: reading jobs (one, a page, a queued job's place, a worker's).
- ``telemetry``: progress and metric points, log lines and their bound, the
  environment record.
- ``usage``: users' fair share and quotas: charging usage, running devices, queued
  counts, the usage listing.
- ``gang``: multi-node jobs: joining a job's gang, starting it whole, its nodes' renewals.
- ``tables``: the Core tables and the queue predicate the partial indexes match.

Callers use the names re-exported here (``store.claim_job``, ``store.Fence``).
"""

from service.store import gang
from service.store.claim import (
    Claim,
    Held,
    claim_job,
    pending_count,
    record_executor,
    record_start,
    renew_lease,
    renew_leases_at_once,
)
from service.store.queries import (
    Standing,
    active_jobs_of,
    get_job,
    list_jobs,
    load_job,
    queue_position,
    queue_standing,
    spec_of,
)
from service.store.submit import create_job, enqueue_job
from service.store.telemetry import append_logs, record_environment, report
from service.store.transitions import (
    Fence,
    Outcome,
    abandon_worker_jobs,
    cancel_job,
    expire_leases,
    finish_attempt,
    release_attempt,
)
from service.store.usage import UserUsage, charge_usage, queued_count, usage_by_user

__all__ = [
    "Claim",
    "Fence",
    "Held",
    "Outcome",
    "Standing",
    "UserUsage",
    "abandon_worker_jobs",
    "active_jobs_of",
    "append_logs",
    "cancel_job",
    "charge_usage",
    "claim_job",
    "create_job",
    "enqueue_job",
    "expire_leases",
    "gang",
    "finish_attempt",
    "get_job",
    "list_jobs",
    "load_job",
    "pending_count",
    "queue_position",
    "queue_standing",
    "queued_count",
    "record_environment",
    "record_executor",
    "record_start",
    "release_attempt",
    "renew_lease",
    "renew_leases_at_once",
    "report",
    "spec_of",
    "usage_by_user",
]
