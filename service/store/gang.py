"""Multi-node jobs: the gang of workers that runs one job across boxes.

A job with ``nodes`` > 1 is never taken by the claim (``claim.py`` passes over it).
Workers join its gang instead, one row each in ``job_node``, holding ``devices`` free
on their box while they wait; the worker whose row completes the gang starts the job
in the same transaction, under the job row's lock: every node or none. A member that
waits past its timeout leaves, and a member whose worker stopped renewing its row is
dropped by the next joiner, so a gang is never completed with a dead node.

Every worker joins the same job first: the queue's first multi-node job that it could
ever serve (highest priority, then oldest), so two jobs cannot each hold half the
boxes; the join timeout ends any wait that cannot fill. While that job waits past the
reservation age, a worker that cannot join yet (its devices busy) claims nothing else,
so a stream of small jobs cannot starve it (``Head.reserving``).

Once running, every node renews the job's lease with the one fence the gang shares,
and its own row; a node whose row goes stale is lost, and the others end the attempt
(``lost_nodes``). Rows go when the job leaves running (``transitions._transition``).

One module past ~300 lines: joining, starting, leaving, renewing and losing a node are
one protocol over the ``job_node`` rows, each step relying on what the others write
under the same lock; split, a reader would have to hold them all in mind anyway.
"""

from __future__ import annotations

import secrets
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from sqlalchemy import Engine, bindparam, delete, insert, literal_column, or_, select, update
from sqlmodel import Session

from service.db import read_session, write_session
from service.jobspec import served_accelerators
from service.models import JobStatus, utcnow
from service.store.claim import CLAIM_COLUMNS, Claim, claim_of, take
from service.store.tables import job_table as _job
from service.store.tables import node_table, queued
from service.store.transitions import Fence
from service.store.usage import quota_limit, running_devices
from service.store.usage import user_table as _user


class Member(NamedTuple):
    """One node of a gang: which worker, with which devices, reachable where."""

    node: int
    worker_id: str
    devices: list[int]
    endpoint: str


# A Member's columns, in its order.
_MEMBER = (node_table.c.node, node_table.c.worker_id, node_table.c.devices, node_table.c.endpoint)


class Head(NamedTuple):
    """The first multi-node job a worker could serve, and what it means for the worker."""

    job_id: int
    joined: Member | None  # this worker's place in its gang, if it joined now
    reserving: bool  # it waited past the reservation age: claim nothing else meanwhile


class Gang(NamedTuple):
    """A gang as one of its members sees it."""

    status: JobStatus | None  # None: the job is gone
    members: list[Member]  # by node
    nodes: int
    claim: Claim | None  # set once the job runs: what this node starts


def _first_job(total: int, accelerator: str, recipes: list[str], now: datetime) -> Any:
    """SQL: the queue's first multi-node job a worker with ``total`` devices could serve."""
    job = _job
    return (
        select(job.c.id, job.c.devices, job.c.nodes, job.c.owner, job.c.created_at)
        .where(
            queued(job),
            job.c.nodes > literal_column("1"),  # as ix_job_gang's predicate says it
            job.c.devices <= total,
            job.c.accelerator.in_(served_accelerators(accelerator)),
            or_(job.c.recipe.in_(recipes), job.c.code.is_not(None)),
            or_(job.c.run_after.is_(None), job.c.run_after <= now),
        )
        .order_by(job.c.priority.desc(), job.c.id)
        .limit(1)
    )


def any_queued(engine: Engine, *, total: int, accelerator: str, recipes: list[str]) -> bool:
    """Whether a multi-node job this worker could serve is queued: an idle worker looks,
    without a lock, before it opens ``head_job``'s write transaction (most looks find
    none)."""
    with read_session(engine) as session:
        first = _first_job(total, accelerator, recipes, utcnow())
        return session.execute(first).first() is not None


def head_job(
    engine: Engine,
    *,
    worker_id: str,
    free: list[int],
    total: int,
    accelerator: str,
    recipes: list[str],
    endpoint: str,
    lease_s: float,
    reserve_after_s: float | None,
    max_running: int | None,
    shunned: set[int],
) -> Head | None:
    """Join the first multi-node job this worker could serve if its devices are free
    now (and start it, when this completes its gang); None when there is none.

    ``free``: the devices free here, ``endpoint``: where this worker would serve the
    rendezvous, ``shunned``: jobs it does not join now (it left their gangs lately, or
    its node of their last attempt is still ending); such a job still reserves.
    """
    now = utcnow()
    with write_session(engine) as session:
        first = _first_job(total, accelerator, recipes, now)
        # The job row's lock serialises its joiners: each sees the others' rows.
        row = session.execute(first.with_for_update()).one_or_none()
        if row is None:
            return None
        job_id, devices, nodes, owner, created_at = row
        if not _within_quota(session, owner, devices * nodes, max_running):
            return Head(job_id, None, False)  # its owner's quota holds it, not devices
        reserving = reserve_after_s is not None and created_at < now - timedelta(
            seconds=reserve_after_s
        )
        if devices > len(free) or job_id in shunned:
            return Head(job_id, None, reserving)
        # A member whose worker stopped renewing is not waiting any more.
        stale = now - timedelta(seconds=lease_s)
        session.execute(
            delete(node_table).where(node_table.c.job_id == job_id, node_table.c.renewed_at < stale)
        )
        members = _members(session, job_id)
        if any(m.worker_id == worker_id for m in members) or len(members) >= nodes:
            return Head(job_id, None, reserving)
        taken = {m.node for m in members}
        node = min(n for n in range(nodes) if n not in taken)
        mine = Member(node, worker_id, free[:devices], endpoint)
        session.execute(
            insert(node_table).values(
                job_id=job_id,
                node=node,
                worker_id=worker_id,
                devices=mine.devices,
                endpoint=endpoint,
                joined_at=now,
                renewed_at=now,
            )
        )
        if len(members) + 1 == nodes:
            _start(session, job_id, sorted([*members, mine]), now, lease_s)
        return Head(job_id, mine, reserving)


def _within_quota(session: Session, owner: str, devices: int, max_running: int | None) -> bool:
    """Whether the owner's running quota has room for the whole job (every node's devices)."""
    row = session.execute(
        select(quota_limit(_user), running_devices(_user.c.name)).where(_user.c.name == owner),
        {"max_running": max_running},
    ).one_or_none()
    if row is None:
        return False  # as the claim: a job whose owner has no user row is never taken
    limit, running = row
    return limit is None or running + devices <= limit


# The claim's UPDATE, for one job named by a parameter.
_TAKE_ONE_JOB = take(bindparam("job"))


def _start(
    session: Session, job_id: int, members: list[Member], now: datetime, lease_s: float
) -> None:
    """The gang is complete: the job runs, as a claim makes a job running, on node 0's
    worker's name, with one lease every node renews."""
    workers = ", ".join(m.worker_id for m in members)
    session.execute(
        _TAKE_ONE_JOB,
        {
            "job": job_id,
            "worker": members[0].worker_id,
            "token": secrets.token_hex(16),
            "expires": now + timedelta(seconds=lease_s),
            "now": now,
            "message": f"attempt running on {len(members)} nodes: {workers}",
        },
    )


def _members(session: Session, job_id: int) -> list[Member]:
    return _nodes(session, node_table.c.job_id == job_id).get(job_id, [])


def _nodes(session: Session, *where: Any) -> dict[int, list[Member]]:
    """The nodes ``where`` says, by job, each job's by node."""
    rows = session.execute(
        select(node_table.c.job_id, *_MEMBER)
        .where(*where)
        .order_by(node_table.c.job_id, node_table.c.node)
    )
    found: dict[int, list[Member]] = {}
    for job_id, node, worker, devices, endpoint in rows:
        found.setdefault(job_id, []).append(Member(node, worker, list(devices), endpoint))
    return found


def gang_of(engine: Engine, job_id: int) -> Gang:
    """A gang as its members see it: the job's status and, once it runs, its claim."""
    with read_session(engine) as session:
        row = session.execute(
            select(_job.c.status, _job.c.nodes, *CLAIM_COLUMNS).where(_job.c.id == job_id)
        ).one_or_none()
        members = _members(session, job_id)
    if row is None:
        return Gang(None, [], 0, None)
    status, nodes, *claimed = row
    running = status == JobStatus.running and row.lease_token is not None
    return Gang(JobStatus(status), members, nodes, claim_of(claimed) if running else None)


def leave(engine: Engine, job_id: int, worker_id: str) -> bool:
    """Give this worker's place back while the job still waits; False if it started
    meanwhile (then the worker is one of its nodes, and must start its part)."""
    with write_session(engine) as session:
        status = session.execute(
            select(_job.c.status).where(_job.c.id == job_id).with_for_update()
        ).scalar_one_or_none()
        if status == JobStatus.running:
            mine = select(node_table.c.node).where(
                node_table.c.job_id == job_id, node_table.c.worker_id == worker_id
            )
            if session.execute(mine).first() is not None:
                return False
        session.execute(
            delete(node_table).where(
                node_table.c.job_id == job_id, node_table.c.worker_id == worker_id
            )
        )
        return True


def renew_nodes(engine: Engine, worker_id: str, job_ids: list[int]) -> None:
    """This worker is alive in these jobs' gangs (the one it waits in, the nodes it runs):
    not in others it may have a row in (a node whose start failed must go silent)."""
    if not job_ids:
        return
    with write_session(engine) as session:
        session.execute(
            update(node_table)
            .where(
                node_table.c.worker_id == worker_id,
                node_table.c.job_id.in_(sorted(job_ids)),
                node_table.c.done_at.is_(None),
            )
            .values(renewed_at=utcnow())
        )


def lost_nodes(engine: Engine, job_ids: list[int], lease_s: float) -> dict[int, list[Member]]:
    """Of these running jobs, the nodes whose workers stopped renewing (not those done)."""
    if not job_ids:
        return {}
    stale = utcnow() - timedelta(seconds=lease_s)
    with read_session(engine) as session:
        return _nodes(
            session,
            node_table.c.job_id.in_(job_ids),
            node_table.c.renewed_at < stale,
            node_table.c.done_at.is_(None),
        )


def node_started(engine: Engine, fence: Fence, worker_id: str, pgid: int) -> None:
    """Note the process group this worker's part runs in (killed if it restarts)."""
    with write_session(engine) as session:
        session.execute(
            update(node_table)
            .where(node_table.c.job_id == fence.job_id, node_table.c.worker_id == worker_id)
            .values(runner_pgid=pgid)
        )


def node_done(engine: Engine, job_id: int, worker_id: str) -> None:
    """This worker's ranks ended well: it is not lost when it stops renewing."""
    with write_session(engine) as session:
        session.execute(
            update(node_table)
            .where(node_table.c.job_id == job_id, node_table.c.worker_id == worker_id)
            .values(done_at=utcnow())
        )


class Held(NamedTuple):
    """A node this worker held before it restarted."""

    job_id: int
    status: JobStatus
    runner_pgid: int | None
    lease_expires_at: datetime | None


def held_by(engine: Engine, worker_id: str) -> list[Held]:
    """The gangs this worker is in, with the job's status (restart recovery)."""
    with read_session(engine) as session:
        rows = session.execute(
            select(
                node_table.c.job_id,
                _job.c.status,
                node_table.c.runner_pgid,
                _job.c.lease_expires_at,
            )
            .join(_job, _job.c.id == node_table.c.job_id)
            .where(node_table.c.worker_id == worker_id)
        )
        return [Held(j, JobStatus(s), p, e) for j, s, p, e in rows]


def nodes_of(session: Session, job_ids: list[int]) -> dict[int, list[Member]]:
    """The nodes of these jobs (the API shows them), by node."""
    return _nodes(session, node_table.c.job_id.in_(job_ids)) if job_ids else {}
