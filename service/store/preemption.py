"""Preemption's reads and write: the contenders a worker weighs (``service.preemption``
decides), and the mark a victim gets before it is stopped."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Engine, bindparam, or_, select, update
from sqlmodel import col

from service import audit
from service.audit import Action
from service.db import read_session, write_session
from service.jobspec import served_accelerators
from service.models import Job, JobStatus, User, utcnow
from service.preemption import Contender
from service.store.claim import _claimable, _shape_params
from service.store.tables import job_table as _job
from service.store.transitions import Fence, fenced

# Waiting jobs weighed at once: the first of them (the claim's order) that stopping
# others would make fit is the one preempted for.
WAITING_WEIGHED = 20
_user = User.__table__  # type: ignore[attr-defined]
_COLUMNS = (
    _job.c.id,
    _job.c.owner,
    _user.c.usage_score,
    _job.c.priority,
    _job.c.devices,
    _job.c.gpu_memory_gb,
    _job.c.nodes,
)


def contenders(
    engine: Engine,
    *,
    accelerator: str,
    recipes: list[str],
    total_devices: int,
    largest_share_gb: float,
    running: list[int],
    now: datetime,
    waited_s: float,
    cooldown_s: float,
) -> tuple[list[Contender], list[Contender]]:
    """(waiting, running): queued jobs this worker could run (whole devices, or a share
    of one of its GPUs up to ``largest_share_gb``) that have waited ``waited_s``, in the
    claim's order (owner's usage, priority, age); and of the ``running`` job ids, those
    that may be stopped (preemptible, not preempted within ``cooldown_s``), whatever
    their shape. A job across boxes does not wait here: its gang forms from the devices
    workers have free (``service.store.gang``)."""
    shape, offer = _shape_params(served_accelerators(accelerator), recipes)
    owner = _user.c.name == _job.c.owner
    waiting = (
        select(*_COLUMNS)
        .join(_user, owner)
        .where(
            *_claimable(_job, "total", "room", shape),  # (one box's jobs only)
            _job.c.created_at <= bindparam("waited_since"),
        )
        .order_by(_user.c.usage_score, _job.c.priority.desc(), _job.c.id)
        .limit(WAITING_WEIGHED)
    )
    stoppable = (
        select(*_COLUMNS)
        .join(_user, owner)
        .where(
            _job.c.id.in_(bindparam("running", expanding=True)),
            _job.c.status == JobStatus.running,
            _job.c.preemptible.is_(True),
            or_(_job.c.preempted_at.is_(None), _job.c.preempted_at < bindparam("cooled")),
        )
    )
    params: dict[str, Any] = {
        **offer,
        "total": total_devices,
        "room": largest_share_gb,
        "now": now,
        "waited_since": now - timedelta(seconds=waited_s),
        "running": running,
        "cooled": now - timedelta(seconds=cooldown_s),
    }
    with read_session(engine) as session:
        found = [Contender(*row) for row in session.execute(waiting, params)]
        stop = [Contender(*row) for row in session.execute(stoppable, params)] if running else []
    return found, stop


def mark_preempted(engine: Engine, fence: Fence, by: Contender) -> bool:
    """Note that the attempt is being stopped for ``by`` (fenced: False when the job is no
    longer this attempt's), with its audit event, before the victim is signalled. The
    other nodes of a job across boxes read the mark as their leases renew, and stop."""
    with write_session(engine) as session:
        result = session.exec(
            update(Job)
            .where(
                *fenced(fence),
                Job.status == JobStatus.running,
                # once: another node's worker may weigh the same gang at the same time
                or_(
                    col(Job.preempted_attempt).is_(None),
                    col(Job.preempted_attempt) != fence.attempt,
                ),
            )
            .values(preempted_at=utcnow(), preempted_attempt=fence.attempt)
        )
        if result.rowcount != 1:
            return False
        audit.record(session, by.owner, Action.preempted, f"job {fence.job_id}", by_job=by.job_id)
        return True
