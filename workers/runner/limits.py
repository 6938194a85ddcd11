"""Limits a runner sets on itself as it starts, before anything else runs: every process
of the attempt inherits them. The supervisor works out the figures
(``workers.supervisor.memory``); the runner applies them, so no process of the job's code
ever ran without them.
"""

from __future__ import annotations

import logging
import resource

log = logging.getLogger(__name__)


def limit_memory(limit_bytes: int) -> None:
    """Limit this process (and every process it starts) to ``limit_bytes`` of data:
    heap and private writable mappings, what a tensor's storage is."""
    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    if hard != resource.RLIM_INFINITY:
        limit_bytes = min(limit_bytes, hard)  # an unprivileged process cannot raise it
    resource.setrlimit(resource.RLIMIT_DATA, (limit_bytes, limit_bytes))
    log.info("memory limit: %d MiB of data per process", limit_bytes // 2**20)
