"""The sweep driver: each API process runs one, and it drives the running sweeps it holds
a lease on (at most one driver per sweep). Every ``DRIVE_INTERVAL_S`` it takes sweeps no
one holds, then for each: reads how its open trials stand, tells the study their new
points and prunes the ones it gives up on, records the trials that ended, starts new
ones up to ``max_parallel`` and ``max_trials``, and ends the sweep when all have ended.

Nothing is only in memory: the study is rebuilt from the rows when a driver takes a
sweep, a trial's job and row are written in one transaction, and every write carries the
lease's fence. A driver that dies (the API killed) loses its leases after
``sweep_lease_s``;
one stopped cleanly hands them back at once.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import socket
import time
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic import ValidationError
from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError

from service import users
from service.catalog import CatalogCache
from service.db import read_session
from service.errors import QueueQuotaReached, SpecInvalid
from service.jobspec import is_script
from service.models import JobStatus
from service.reasons import ReasonCode
from service.settings import Settings
from service.store import sweep_reads as reads
from service.store import sweeps as store
from service.store.sweep_reads import TrialRow
from service.store.sweeps import SweepFence
from service.sweeps.models import Mode, Resource, SweepCreate, SweepStatus, TrialState
from service.sweeps.space import grid_size, trial_spec

log = logging.getLogger(__name__)

DRIVE_INTERVAL_S = 0.5  # how often a driver looks at its sweeps
# A lease lasts Settings.sweep_lease_s, renewed every third of it (not on every pass:
# SQLite has one writer).
RENEW_FRACTION = 1 / 3
MAX_SWEEPS_PER_DRIVER = 64
# A sweep whose first trials all fail stops: the rest would fail the same way.
FAILED_TRIALS_TO_STOP = 3
ENDED = (JobStatus.succeeded, JobStatus.failed, JobStatus.cancelled)
Point = tuple[int, int, float | None]  # a metric point: step, epoch, value


@dataclass
class Held:
    """A sweep this driver holds, and what it keeps of it between passes."""

    fence: SweepFence
    spec: SweepCreate
    owner: str
    target: int  # trials it starts in all
    study: Any  # service.sweeps.search.Study (imported when first needed: it imports Optuna)
    started: int
    renewed_at: float
    open: dict[int, int] = field(default_factory=dict)  # trial number -> job id, job not ended
    seen_seq: dict[int, int] = field(default_factory=dict)  # job id -> last metric point read
    last: dict[int, float | None] = field(default_factory=dict)  # number -> last value
    failed: set[int] = field(default_factory=set)  # trials whose job failed (or never ran)
    pending: tuple[int, dict[str, Any], dict[str, Any]] | None = None  # asked, not started


class Driver:
    """One API process's sweep driver."""

    def __init__(self, engine: Engine, settings: Settings, catalogs: CatalogCache) -> None:
        self.engine = engine
        self.settings = settings
        self.catalogs = catalogs
        self.id = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        self.held: dict[int, Held] = {}
        self.lease_s = settings.sweep_lease_s

    def drive(self) -> None:
        """One pass over the sweeps: take free ones, then move each along."""
        room = MAX_SWEEPS_PER_DRIVER - len(self.held)
        if room > 0:
            for fence in store.take_sweeps(self.engine, self.id, self.lease_s, room):
                held = self._load_or_end(fence)
                if held is not None:
                    self.held[fence.sweep_id] = held
        for sweep_id, held in list(self.held.items()):
            try:
                keep = self._step(held)
            except Exception:  # the database may be down a while: the lease decides
                log.exception("sweep %d: pass failed", sweep_id)
                keep = time.monotonic() - held.renewed_at < self.lease_s
            if not keep:
                del self.held[sweep_id]

    def close(self) -> None:
        """Hand every held sweep back, for the next driver to take at once."""
        store.let_go(self.engine, [h.fence for h in self.held.values()])
        self.held.clear()

    def _load_or_end(self, fence: SweepFence) -> Held | None:
        """``_load``, one sweep at a time: the database down lets the sweep go (the next
        pass takes it again); a sweep that cannot be loaded at all (its study refused)
        ends failed, saying why, rather than stalling the sweeps taken with it."""
        try:
            return self._load(fence)
        except DBAPIError:
            log.exception("sweep %d: could not read it; letting it go", fence.sweep_id)
            with contextlib.suppress(DBAPIError):
                store.let_go(self.engine, [fence])
            return None
        except Exception as exc:
            log.exception("sweep %d: cannot be driven", fence.sweep_id)
            why = f"the sweep driver cannot run it: {type(exc).__name__}: {exc}"[:2000]
            store.end_sweep(self.engine, fence, SweepStatus.failed, (ReasonCode.error, why))
            return None

    def _load(self, fence: SweepFence) -> Held | None:
        """The sweep's spec and trials, and its study rebuilt from them."""
        from service.sweeps.search import PastTrial, Study  # Optuna: when first needed

        with read_session(self.engine) as session:
            sweep = reads.get_sweep(session, fence.sweep_id)
            rows = reads.trials(session, fence.sweep_id)
            jobs = [r.job_id for r in rows if r.job_id is not None]
            points = reads.points(session, jobs, sweep.spec["metric"])
        spec = SweepCreate.model_validate(sweep.spec)
        by_job: dict[int, list[Point]] = {}
        seen: dict[int, int] = {}
        for job_id, step, epoch, value, seq in points:
            by_job.setdefault(job_id, []).append((step, epoch, value))
            seen[job_id] = max(seen.get(job_id, 0), seq)
        # A pruned trial whose job trained to its end while no driver held the sweep
        # counts complete, as in _finished_anyway.
        whole = {
            r.number: last
            for r in rows
            if r.state == TrialState.pruned
            and r.job_status == JobStatus.succeeded
            and (last := _last(by_job.get(r.job_id or 0, []))) is not None
        }
        for number, value in whole.items():
            store.end_trial(self.engine, fence, number, TrialState.complete, value)
        rows = [
            replace(r, state=TrialState.complete, value=whole[r.number]) if r.number in whole else r
            for r in rows
        ]
        past = [
            PastTrial(
                values=r.values,
                system_attrs=r.system_attrs,
                state=r.state,
                value=r.value,
                intermediate=_intermediate(spec, by_job.get(r.job_id or 0, [])),
            )
            for r in rows
        ]
        held = Held(
            fence=fence,
            spec=spec,
            owner=sweep.owner,
            target=_target(spec),
            study=Study(f"sweep-{fence.sweep_id}", spec, past),
            started=len(rows),
            renewed_at=time.monotonic(),
            seen_seq=seen,
        )
        for r in rows:
            if r.job_id is not None and (
                r.state == TrialState.running or r.job_status not in ENDED
            ):
                held.open[r.number] = r.job_id
            if _failed(r.state, r.job_status):
                held.failed.add(r.number)
            held.last[r.number] = _last(by_job.get(r.job_id or 0, []))
        log.info("sweep %d: driving it (%d trials so far)", fence.sweep_id, len(rows))
        return held

    def _renewed(self, held: Held) -> bool:
        """Renew the lease when a third of it has passed; False once it is not ours."""
        if time.monotonic() - held.renewed_at < self.lease_s * RENEW_FRACTION:
            return True
        if not store.renew(self.engine, held.fence, self.lease_s):
            log.info("sweep %d: no longer ours (ended, or taken over)", held.fence.sweep_id)
            return False
        held.renewed_at = time.monotonic()
        return True

    def _step(self, held: Held) -> bool:
        """Move one sweep along; False once this driver no longer holds it."""
        if not self._renewed(held):
            return False
        if not self._watch(held):
            return False
        if self._end_if_done(held):
            return False
        return self._start_trials(held)

    def _watch(self, held: Held) -> bool:
        """Read the open trials and their new points: prune, and record those that ended."""
        if not held.open:
            return True
        spec = held.spec
        with read_session(self.engine) as session:
            rows = reads.trials(session, held.fence.sweep_id, list(held.open))
            jobs = [r.job_id for r in rows if r.job_id is not None]
            after = min((held.seen_seq.get(j, 0) for j in jobs), default=0)
            fresh = reads.points(session, jobs, spec.metric, after)
        new: dict[int, list[Point]] = {}
        seen = dict(held.seen_seq)  # what was read before this pass, per job
        for job_id, step, epoch, value, seq in fresh:
            if seq > seen.get(job_id, 0):
                new.setdefault(job_id, []).append((step, epoch, value))
                held.seen_seq[job_id] = max(held.seen_seq.get(job_id, 0), seq)
        for row in rows:
            assert row.job_id is not None  # open trials have jobs
            points = new.get(row.job_id, [])
            if points:
                held.last[row.number] = _last(points)
            # Every trial's points reach the study, a fast one's too: the pruner ranks
            # a trial against the others' values at the same point.
            if row.state == TrialState.running and not self._report(held, row, points):
                return False
            if row.job_status in ENDED:
                if row.state == TrialState.running and not self._end_trial(held, row):
                    return False
                if row.state == TrialState.pruned and not self._finished_anyway(held, row):
                    return False
                del held.open[row.number]
        return True

    def _finished_anyway(self, held: Held, row: TrialRow) -> bool:
        """A pruned trial whose job trained to its end before the stop landed (as a late
        cancel does): its result is whole, so it counts as complete, and may be the best.
        (The study in memory keeps it pruned: Optuna cannot change a finished trial; a
        study rebuilt from the rows has it complete.)"""
        value = held.last.get(row.number)
        if row.job_status != JobStatus.succeeded or value is None:
            return True
        return store.end_trial(self.engine, held.fence, row.number, TrialState.complete, value)

    def _report(self, held: Held, row: TrialRow, points: list[Point]) -> bool:
        """Tell the study a trial's new points; prune it if the pruner says so and its job
        still runs (one that ended is recorded as it ended)."""
        spec = held.spec
        if spec.pruner is None or not points:
            return True
        assert row.job_id is not None  # a running trial has a job
        at_points = _intermediate(spec, points)
        # Only a running job is stopped, and never at its last point: nothing is left to
        # save there, and its whole result would be lost to the ranking.
        budget = _budget(spec, row) if row.job_status == JobStatus.running else None
        at, notes = held.study.report(row.number, at_points.items(), budget)
        if notes is not None and not store.note_trial(self.engine, held.fence, row.number, notes):
            return False
        if at is None:
            return True
        why = (
            f"pruned by the sweep's {spec.pruner.type} pruner at {spec.pruner.resource} {at}: "
            f"{spec.metric} {at_points[at]:.4g} trails the other trials there"
        )
        if not store.prune(self.engine, held.fence, row.number, row.job_id, held.owner, why):
            return False
        held.study.end(row.number, TrialState.pruned, None)
        log.info("sweep %d: trial %d (job %d) %s", held.fence.sweep_id, row.number, row.job_id, why)
        return True

    def _end_trial(self, held: Held, row: TrialRow) -> bool:
        """A trial whose job ended: complete with its last value, pruned, or failed."""
        value = held.last.get(row.number)
        if row.job_status == JobStatus.succeeded and value is not None:
            state = TrialState.complete
        elif row.job_status == JobStatus.cancelled and row.reason_code == ReasonCode.pruned:
            state = TrialState.pruned
        else:  # failed, cancelled by a person, or never reported the metric
            state, value = TrialState.failed, None
        if not store.end_trial(self.engine, held.fence, row.number, state, value):
            return False
        held.study.end(row.number, state, value)
        if _failed(state, row.job_status):
            held.failed.add(row.number)
        return True

    def _end_if_done(self, held: Held) -> bool:
        """End the sweep when every trial has ended, or its first ones all failed."""
        first = set(range(FAILED_TRIALS_TO_STOP))
        if first <= held.failed and self._best(held) is None:
            status = SweepStatus.failed  # the rest would fail too: end_sweep cancels them
            reason = (
                ReasonCode.error,
                f"its first {FAILED_TRIALS_TO_STOP} trials failed, none succeeded",
            )
        elif held.started >= held.target and not held.open:
            status, reason = SweepStatus.finished, (ReasonCode.succeeded, self._summary(held))
        else:
            return False
        if store.end_sweep(self.engine, held.fence, status, reason):
            log.info("sweep %d: %s: %s", held.fence.sweep_id, status, reason[1])
        return True

    def _best(self, held: Held) -> tuple[int, float] | None:
        with read_session(self.engine) as session:
            return reads.best_trial(session, held.fence.sweep_id, held.spec.mode == Mode.min)

    def _summary(self, held: Held) -> str:
        """How the sweep's trials ended, and its best: its reason when it finishes."""
        with read_session(self.engine) as session:
            counts = reads.state_counts(session, held.fence.sweep_id)
        best = self._best(held)
        said = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()) if n)
        told = f"; best: trial {best[0]} ({held.spec.metric} {best[1]:.6g})" if best else ""
        return f"{held.started} trials ({said}){told}"

    def _start_trials(self, held: Held) -> bool:
        """Start trials while fewer than max_parallel are unfinished."""
        while held.started < held.target and len(held.open) < held.spec.max_parallel:
            if not self._renewed(held):  # asking TPE for many trials takes a while
                return False
            if held.pending is None:
                held.pending = held.study.ask()
            number, values, attrs = held.pending
            started = self._start(held, number, values, attrs)
            if started is None:
                return False
            if started is False:
                return True  # its owner's queue is full: the next pass tries again
            held.pending = None
            held.started += 1
        return True

    def _start(
        self, held: Held, number: int, values: dict[str, Any], attrs: dict[str, Any]
    ) -> bool | None:
        """Trial ``number``'s job; False if it must wait, None if the lease is gone."""
        try:
            spec = trial_spec(held.spec, values, number)
            reason = self.catalogs.check(self.engine, spec)
        except (ValidationError, SpecInvalid) as refused:
            return self._refused(held, number, values, attrs, refused)
        limits = users.OWN_LIMITS.get(self.engine)
        queue_limit = users.queue_limit(limits, held.owner, self.settings)
        try:
            job_id = store.start_trial(
                self.engine,
                held.fence,
                number=number,
                values=values,
                system_attrs=attrs,
                spec=spec,
                owner=held.owner,
                reason=reason,
                queue_limit=queue_limit,
            )
        except QueueQuotaReached:
            return False
        if job_id is None:
            return None
        held.open[number] = job_id
        return True

    def _refused(
        self,
        held: Held,
        number: int,
        values: dict[str, Any],
        attrs: dict[str, Any],
        refused: Exception,
    ) -> bool | None:
        """A trial whose values make a spec no worker could run: recorded failed, no job."""
        why = f"its spec was refused: {refused}"[:2000]
        if not store.refused_trial(self.engine, held.fence, number, values, attrs, why):
            return None
        held.study.end(number, TrialState.failed, None)
        held.failed.add(number)
        return True


def _failed(state: TrialState, job_status: JobStatus | None) -> bool:
    """A trial that failed on its own: its job failed, or its spec was refused (a trial a
    person cancelled is no sign the next would fail)."""
    return state == TrialState.failed and job_status in (JobStatus.failed, None)


def _budget(spec: SweepCreate, row: TrialRow) -> int:
    """A trial's last point, in the pruner's resource: its epochs, or its total steps
    (as its progress says, else as its spec does)."""
    progress = row.progress or {}
    assert spec.pruner is not None
    unknown = 2**31  # a script that does not say: any point may be pruned
    if spec.pruner.resource == Resource.step:
        return int(progress.get("total_steps") or unknown)
    if progress.get("epochs"):
        return int(progress["epochs"])
    recipe_epochs = not is_script(spec.job) and "epochs" not in spec.parameters
    return spec.job.epochs if recipe_epochs else unknown


def _target(spec: SweepCreate) -> int:
    if spec.max_trials is not None:
        return spec.max_trials
    return grid_size(spec)


def _intermediate(spec: SweepCreate, points: list[Point]) -> dict[int, float]:
    """A trial's points as the pruner counts them: by epoch or by step, the first value
    reported at each (a val/ metric has one per epoch), finite values only."""
    by_epoch = spec.pruner is None or spec.pruner.resource == Resource.epoch
    out: dict[int, float] = {}
    for step, epoch, value in points:
        at = epoch if by_epoch else step
        if value is not None and at not in out:
            out[at] = value
    return out


def _last(points: list[Point]) -> float | None:
    return points[-1][2] if points else None
