"""Container healthcheck for a worker: healthy while its heartbeat in the database is fresh."""

from __future__ import annotations

import platform
import sys

from service.catalog import WORKER_ALIVE_S
from service.db import make_engine, read_session
from service.models import Worker, utcnow
from service.settings import Settings


def main(argv: list[str]) -> int:
    """Exit 0 when the worker (``argv[0]`` or the configured id) heartbeated recently."""
    settings = Settings()
    worker_id = argv[0] if argv else settings.worker_id or platform.node()
    with read_session(make_engine(settings)) as session:
        worker = session.get(Worker, worker_id)
    if worker is None or worker.stopped_at is not None:
        sys.stderr.write(f"worker {worker_id} is not registered or has stopped\n")
        return 1
    age = (utcnow() - worker.heartbeat_at).total_seconds()
    if age > WORKER_ALIVE_S:
        sys.stderr.write(f"worker {worker_id}: last heartbeat {age:.0f}s ago\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
