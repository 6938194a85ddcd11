"""Moves an attempt's points into the database in batches, in the supervisor.

Rank 0 appends its progress and metric points to a file (``workers.points_file``); the
supervisor, the one process of a box that holds the database's credentials, runs a
reporter per attempt that follows that file, and records the attempt's environment once
the runner has written it. Every write is fenced by the attempt's lease.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from sqlalchemy import Engine

from service import store
from service.db import unavailable
from service.points import MetricPoint, ProgressPoint
from service.store import Fence
from workers.jobfiles import JobFiles
from workers.outcome import RunnerReport
from workers.points_file import Batcher, PointsReader
from workers.supervisor import nofollow

log = logging.getLogger(__name__)

# How often buffered progress and metrics are written (progress must refresh every second).
FLUSH_INTERVAL_S = 0.5
# Closing, the reporter reads what is left of the points file for at most this long (a
# process of the job that escaped and keeps appending must not hold the attempt's end).
CLOSE_LIMIT_S = 10.0
# A runner's report is a few KiB (an error's traceback tail); past this it is not one.
MAX_REPORT_BYTES = 2**20
# An environment record is a few KiB (packages, devices); past this it is not one.
MAX_ENVIRONMENT_BYTES = 2**20


class DbReporter(Batcher):
    """A queue of points, and a thread that writes them in batches, fenced.

    ``put_nowait`` never blocks and never touches the database; only the latest progress
    of a batch is written. ``source``: a points file the thread reads every interval
    (rank 0's, in another process); ``environment``: the runner's environment record,
    stored once it is there; both, and ``flushed_marker``, below ``job_folder``, which is
    the job's: read and written never through a link.
    """

    def __init__(
        self,
        engine: Engine,
        fence: Fence,
        *,
        flush_interval_s: float = FLUSH_INTERVAL_S,
        on_lease_lost: Callable[[], object] | None = None,
        lease_s: float | None = None,
        source: PointsReader | None = None,
        job_folder: Path | None = None,
        environment: Path | None = None,
        flushed_marker: Path | None = None,
        marker_owner: tuple[int, int] | None = None,
    ) -> None:
        super().__init__("db-reporter", flush_interval_s)
        if job_folder is None and (environment or flushed_marker):
            raise ValueError("a job's environment record and marker are below its folder")
        self.engine = engine
        self.fence = fence
        self.on_lease_lost = on_lease_lost
        self.lease_s = lease_s
        self.source = source
        self.job_folder = job_folder
        self.environment = environment
        self.flushed_marker = flushed_marker
        self.marker_owner = marker_owner  # (uid, gid) of the job's account, which reads it
        self._last_stored = time.monotonic()

    @classmethod
    def of_attempt(
        cls,
        engine: Engine,
        fence: Fence,
        files: JobFiles,
        *,
        on_lease_lost: Callable[[], object],
        lease_s: float,
        marker_owner: tuple[int, int] | None = None,
    ) -> DbReporter:
        """The reporter of one attempt's (or one node's) folder: rank 0's points file and
        the runner's environment record, read never through a link. Not started."""
        points = files.points(fence.attempt)
        return cls(
            engine,
            fence,
            on_lease_lost=on_lease_lost,
            flushed_marker=files.flushed_marker,
            lease_s=lease_s,
            source=PointsReader(points, partial(_read_below, files.root, points)),
            environment=files.environment(fence.attempt),
            marker_owner=marker_owner,
            job_folder=files.root,
        )

    def _loop(self) -> None:
        progress: ProgressPoint | None = None
        metrics: list[MetricPoint] = []
        done = False
        while not done:
            done = self._interval()
            last_look = time.monotonic() + (CLOSE_LIMIT_S if done else 0.0)
            try:
                self._record_environment()
                while True:
                    # One look at the points file at a time, and only once the last batch
                    # is stored: a long outage, or a job that appended gigabytes, must not
                    # fill this process's memory.
                    read = not metrics and progress is None and self._read_source()
                    progress, metrics = self._take(progress, metrics)
                    if (progress is not None or metrics) and self._write(progress, metrics):
                        progress, metrics = None, []  # else kept, and tried again later
                    if not (read and progress is None and time.monotonic() < last_look):
                        break
            except Exception:  # never the thread's end: the next interval tries again
                log.exception("job %s: reporting failed; trying again", self.fence.job_id)

    def _read_source(self) -> bool:
        """Queue what rank 0 appended since the last look, one bounded read; whether it
        found any."""
        if self.source is None:
            return False
        points = self.source.read()
        for point in points:
            self.points.put_nowait(point)
        return bool(points)

    def _record_environment(self) -> None:
        """Store the runner's environment record once it is whole on disk."""
        if self.environment is None or self.job_folder is None:
            return
        try:  # the job's own writing: bounded, and never through a link
            data = nofollow.read(self.job_folder, self.environment, MAX_ENVIRONMENT_BYTES + 1)
            if data is None:
                return
            record = json.loads(data)
            if not isinstance(record, dict):
                raise ValueError("not an object")
        except (OSError, ValueError) as exc:  # written atomically: not a half file
            log.error("job %s: environment record not stored (%s)", self.fence.job_id, exc)
            self.environment = None
            return
        try:
            owned = store.record_environment(self.engine, self.fence, record)
        except Exception:
            log.exception("job %s: could not record the environment; will retry", self.fence.job_id)
            return
        self.environment = None
        if not owned:
            self._lost()

    def _write(self, progress: ProgressPoint | None, metrics: list[MetricPoint]) -> bool:
        """Store a batch; False when it should be tried again."""
        try:
            owned = store.report(self.engine, self.fence, progress=progress, metrics=metrics)
        except Exception as exc:  # a database hiccup must not kill training: retry with the next
            if not unavailable(exc):  # it refused a value: retried, it would refuse it forever
                return self._write_each(progress, metrics)
            log.exception("job %s: could not record progress; will retry", self.fence.job_id)
            if self.lease_s is not None and time.monotonic() - self._last_stored > self.lease_s:
                # Longer than a lease without the database: the lease has run out, so
                # the job may be someone else's by now. Nothing done here can count.
                self._lost()
            return False
        return self._stored(owned, metrics)

    def _write_each(self, progress: ProgressPoint | None, metrics: list[MetricPoint]) -> bool:
        """Store a batch the database refused a point at a time, leaving out each point it
        refuses: one bad point must not hold back the rest until the lease runs out."""
        log.warning("job %s: a batch was refused; writing it point by point", self.fence.job_id)
        points: list[MetricPoint | ProgressPoint] = [*metrics]
        if progress is not None:
            points.append(progress)  # last, as in a batch: it sums up the points before it
        for point in points:
            alone = point if isinstance(point, ProgressPoint) else None
            metric = [point] if isinstance(point, MetricPoint) else []
            try:
                owned = store.report(self.engine, self.fence, progress=alone, metrics=metric)
            except Exception as exc:
                if unavailable(exc):  # gone meanwhile: all of it again with the next batch
                    return False
                log.error(
                    "job %s: point left out, the database refused it (%s): %.300r",
                    self.fence.job_id,
                    exc.__class__.__name__,
                    point,
                )
                continue
            if not owned:
                return self._stored(False, [])
        return self._stored(True, metrics)

    def _stored(self, owned: bool, metrics: list[MetricPoint]) -> bool:
        """After a write: the lease lost, or every point up to the batch's last step stored."""
        self._last_stored = time.monotonic()
        if not owned:
            self._lost()
        elif metrics and self.flushed_marker is not None and self.job_folder is not None:
            # Points arrive in step order: everything up to this step is stored now.
            step = str(max(m.step for m in metrics)).encode()
            nofollow.write(self.job_folder, self.flushed_marker, step, self.marker_owner)
        return True

    def _lost(self) -> None:
        log.warning("job %s: lease lost; progress no longer recorded", self.fence.job_id)
        if self.on_lease_lost is not None:
            self.on_lease_lost()


def runner_report(files: JobFiles, attempt: int) -> RunnerReport | None:
    """How the runner says the attempt ended: its file in the job's (or node's) folder,
    read never through a link (the job's account may have put one there)."""
    try:
        data = nofollow.read(files.root, files.outcome(attempt), MAX_REPORT_BYTES)
    except OSError as exc:
        log.warning("job folder %s: attempt %d's report not read: %s", files.root, attempt, exc)
        return None
    return None if data is None else RunnerReport.parse(data)


def _read_below(root: Path, path: Path, offset: int, limit: int) -> bytes | None:
    return nofollow.read(root, path, limit, offset)
