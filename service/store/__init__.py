"""The job store (moved here whole; split into modules next)."""

from service.store.transitions import *  # noqa: F403
from service.store.transitions import S, _insert_jobs, _row  # noqa: F401
