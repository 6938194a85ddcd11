"""Users' fair share and quotas: charging usage, a user's running devices and queued jobs.

The claim's own use of these (the order by usage, the running quota) is SQL in
``claim.py``; the terms both use are here (``running_devices``, ``quota_limit``).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import Engine, Integer, bindparam, func, literal_column, select, update
from sqlmodel import Session

from service import fair_share
from service.db import write_session
from service.models import JobStatus, User
from service.store.tables import job_table as _job
from service.store.tables import queued

user_table = User.__table__  # type: ignore[attr-defined]

# A job holds its devices while running or cancelling (its processes are still going).
HOLDING = (JobStatus.running, JobStatus.cancelling)


def running_devices(owner: Any) -> Any:
    """SQL: the devices ``owner``'s jobs hold now, on every node (a share of a GPU counts
    as 1: its job asks for ``devices: 1``), by ix_job_owner_status.

    The claim evaluates it only where a quota is in force (``quota_limit`` is not NULL).
    Known gap: SQLite with statistics from a burst (ANALYZE while one owner had every
    job queued) plans it as a scan of the job table; the service never runs ANALYZE on
    SQLite, and without statistics it reads the index."""
    held = _job.alias("held")
    holding = held.c.status.in_([literal_column(f"'{s.value}'") for s in HOLDING])
    # a job across boxes holds its devices on every node
    total = select(func.coalesce(func.sum(held.c.devices * held.c.nodes), 0))
    # correlated to whatever names ``owner``, however deep it is nested
    return total.where(held.c.owner == owner, holding).correlate_except(held).scalar_subquery()


def quota_limit(user: Any) -> Any:
    """SQL: the user's running-devices limit: their own, else the ``max_running`` param
    (the settings' default; NULL: no limit)."""
    return func.coalesce(
        user.c.max_running_devices, bindparam("max_running", type_=Integer, required=False)
    )


def charge_usage(
    engine: Engine, charges: Mapping[str, float], at: datetime, half_life_s: float
) -> None:
    """Add device-seconds to users' usage as of ``at``, in one write transaction.

    Each row is read locked and its new score computed here (a log-sum-exp SQLite has no
    function for); names in order, so two workers charging the same users cannot
    deadlock. A name with no user row is skipped."""
    charges = {name: s for name, s in charges.items() if s > 0}
    if not charges:
        return
    with write_session(engine) as session:
        rows = session.execute(
            select(user_table.c.name, user_table.c.usage_score)
            .where(user_table.c.name.in_(sorted(charges)))
            .order_by(user_table.c.name)
            .with_for_update()  # SQLite: its IMMEDIATE transaction already holds the lock
        ).all()
        for name, score in rows:
            new = fair_share.charged(score, charges[name], at, half_life_s)
            session.execute(
                update(user_table).where(user_table.c.name == name).values(usage_score=new)
            )


def queued_count(session: Session, owner: str) -> int:
    """How many jobs ``owner`` has queued (the submit's queued quota)."""
    count = select(func.count()).where(_job.c.owner == owner, queued(_job))
    return int(session.execute(count.select_from(_job)).scalar_one())


class UserUsage(NamedTuple):
    """A user's fair-share usage now, what their jobs hold and wait for, their quotas."""

    name: str
    usage_device_s: float  # decayed device-seconds, as of the call
    running_devices: int
    queued_jobs: int
    max_running_devices: int | None  # in force: theirs, else the default; None: no limit
    max_queued_jobs: int | None


def usage_by_user(
    session: Session,
    now: datetime,
    half_life_s: float,
    *,
    default_max_running: int | None = None,
    default_max_queued: int | None = None,
) -> list[UserUsage]:
    """Every user, least usage first (the order the claim serves them in)."""
    users = session.execute(
        select(
            user_table.c.name,
            user_table.c.usage_score,
            user_table.c.max_running_devices,
            user_table.c.max_queued_jobs,
        ).order_by(user_table.c.usage_score, user_table.c.name)
    ).all()
    active = [JobStatus.queued, *HOLDING]
    counts = session.execute(
        select(
            _job.c.owner,
            _job.c.status,
            func.count(),
            func.coalesce(func.sum(_job.c.devices * _job.c.nodes), 0),
        )
        .where(_job.c.status.in_(active))
        .group_by(_job.c.owner, _job.c.status)
    ).all()
    queued_jobs: dict[str, int] = {}
    holding: dict[str, int] = {}
    for owner, status, n, devices in counts:
        if status == JobStatus.queued:
            queued_jobs[owner] = int(n)
        else:
            holding[owner] = holding.get(owner, 0) + int(devices)
    return [
        UserUsage(
            name=name,
            usage_device_s=fair_share.usage_at(score, now, half_life_s),
            running_devices=holding.get(name, 0),
            queued_jobs=queued_jobs.get(name, 0),
            max_running_devices=max_running if max_running is not None else default_max_running,
            max_queued_jobs=max_queued if max_queued is not None else default_max_queued,
        )
        for name, score, max_running, max_queued in users
    ]
