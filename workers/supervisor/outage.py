"""The worker's view of the database: up, or down since when, said once per outage."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from sqlalchemy.exc import DBAPIError

log = logging.getLogger(__name__)
T = TypeVar("T")


class DatabaseWatch:
    """Runs the loop's database steps; an unreachable database is logged once per outage,
    and the loop goes on: running jobs continue while their leases last."""

    def __init__(self) -> None:
        self.down_since: float | None = None

    @property
    def down(self) -> bool:
        return self.down_since is not None

    def call(self, step: Callable[[], T]) -> T | None:
        """``step()``, or None when the database could not be reached."""
        try:
            result = step()
        except DBAPIError as exc:
            if self.down_since is None:
                self.down_since = time.monotonic()
                log.error("database unreachable; jobs go on for up to a lease: %s", exc)
            return None
        if self.down_since is not None:
            log.warning("database reachable again after %.1fs", time.monotonic() - self.down_since)
            self.down_since = None
        return result
