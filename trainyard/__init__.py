"""Trainyard's Python client: ``Client`` (and ``AsyncClient``) talk to a Trainyard server's
API; what they answer are the API's own models (``trainyard.models``), what goes wrong
the exceptions of ``trainyard.errors``. It needs httpx, pydantic and pathspec only."""

from trainyard.aio import AsyncClient
from trainyard.client import Client, Upload
from trainyard.errors import (
    ApiError,
    BadRequest,
    Conflict,
    Forbidden,
    Invalid,
    NotFound,
    QuotaExceeded,
    TooLarge,
    TrainyardError,
    Unauthorized,
    Unavailable,
    Unreachable,
    WaitTimeout,
)
from trainyard.handles import AsyncJob, AsyncSweep, Job, Sweep
from trainyard.models import Event, JobStatus, SweepStatus

__version__ = "0.1.0"

__all__ = [
    "ApiError",
    "AsyncClient",
    "AsyncJob",
    "AsyncSweep",
    "BadRequest",
    "Client",
    "Conflict",
    "Event",
    "Forbidden",
    "Invalid",
    "Job",
    "JobStatus",
    "NotFound",
    "QuotaExceeded",
    "Sweep",
    "SweepStatus",
    "TooLarge",
    "TrainyardError",
    "Unauthorized",
    "Unavailable",
    "Unreachable",
    "Upload",
    "WaitTimeout",
]
