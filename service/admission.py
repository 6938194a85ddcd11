"""Admission: the checks a job passes before it is enqueued, one order for every way in.

A submit and a rerun both call ``admit``, so a spec a submit refuses a rerun refuses with
the same status and words. In order: who may ask for it (403), whether this server can
run it at all (a job across boxes needs PostgreSQL) and whether a registered worker could
(422), whether it fits its owner's quota of running devices at all (422: it would wait
forever), then its inputs (422). The owner's limit on queued jobs (429) is counted in the
transaction that inserts the job (``service.store.submit``), so submits racing each other
cannot pass it; a job with inputs is also counted before them, because their check is the
costly one (it reads the stored blobs and unpacks the package).

Each refusal is a domain error, mapped to HTTP in the one handler of ``service.api``.
``admit`` runs on the event loop and hands a step to the thread pool only where it must
query: a one-device submit the cached catalog accepts, with no code of its own, holds no
thread before its insert.
"""

from __future__ import annotations

from typing import NamedTuple

from anyio import to_thread
from sqlalchemy import Engine
from sqlmodel import select

from service import blob_rows, store, users
from service.blobs import BlobStore
from service.catalog import Catalog, CatalogCache
from service.db import is_sqlite, read_session
from service.errors import SpecInvalid
from service.inputs import check_inputs
from service.jobspec import blob_uses, field_of
from service.models import JobCreate, User
from service.packages import PackageLimits
from service.reasons import ReasonCode
from service.settings import Settings
from service.users import Identity


class Admitted(NamedTuple):
    """What the insert needs of an admitted job: why it waits, and its owner's limit on
    queued jobs (counted with the insert; None: no limit)."""

    reason: tuple[ReasonCode, str]
    queue_limit: tuple[int, str] | None


async def admit(
    spec: JobCreate,
    who: Identity,
    *,
    engine: Engine,
    catalogs: CatalogCache,
    settings: Settings,
    blobs: BlobStore,
    idempotency_key: str | None = None,
) -> Admitted:
    """Refuse a spec ``who`` may not enqueue; else why it waits, and the queued limit.
    With an ``idempotency_key`` the queued limit is left to the insert, which answers a
    retry with its job before it counts."""
    users.check_spec_rights(who, spec)
    if spec.nodes > 1 and is_sqlite(engine):  # only a Slurm worker serves it there
        catalog = catalogs.cached() or await to_thread.run_sync(catalogs.get, engine)
        _check_database(engine, spec, catalog)
    reason = catalogs.check_cached(spec)
    if reason is None:  # the cached catalog expired, or would refuse it: ask as of now
        reason = await to_thread.run_sync(catalogs.check, engine, spec)
    if spec.devices * spec.nodes > 1:  # every quota allows one device: no query for those
        await to_thread.run_sync(_check_running_quota, engine, who.name, spec, settings)
    own_limits = users.OWN_LIMITS.cached()
    if own_limits is None:
        own_limits = await to_thread.run_sync(users.OWN_LIMITS.get, engine)
    queue_limit = users.queue_limit(own_limits, who.name, settings)
    if spec.code is not None:  # its own code and data: stored, and the package safe
        # (data without code was refused with the catalog's check of the spec's shape)
        if queue_limit is not None and idempotency_key is None:  # said before the costly check
            await to_thread.run_sync(_check_queue_quota, engine, who.name, queue_limit)
        limits = PackageLimits.from_settings(settings)
        await to_thread.run_sync(_check_inputs, engine, blobs, limits, spec, who)
    return Admitted(reason, queue_limit)


def check_trial(engine: Engine, who: Identity, spec: JobCreate, settings: Settings) -> None:
    """What ``admit`` checks of a spec beyond the catalog and its inputs, for a sweep's
    trial values at submit: that ``who`` may ask for it, that this server could run it,
    and that it fits its owner's quota of running devices (else it would wait forever)."""
    users.check_spec_rights(who, spec)
    _check_database(engine, spec)
    if spec.devices * spec.nodes > 1:
        _check_running_quota(engine, who.name, spec, settings)


def _check_inputs(
    engine: Engine, blobs: BlobStore, limits: PackageLimits, spec: JobCreate, who: Identity
) -> None:
    """The job's blobs stored and the package safe; for a user other than an admin, only
    blobs they may see, so a digest alone never gets them someone else's data. One they
    may not is refused in the words of one not stored: its existence is not theirs to
    learn."""
    if not who.admin:
        uses = blob_uses(spec)
        with read_session(engine) as session:
            seen = blob_rows.visible_of(session, who.name, list(uses.values()))
        for role, digest in uses.items():
            if digest not in seen:
                raise SpecInvalid.at(
                    field_of(role),
                    f"blob {digest} is not stored: upload it first with PUT /api/v1/blobs/{digest}",
                )
    check_inputs(engine, blobs, limits, spec)


def _check_database(engine: Engine, spec: JobCreate, catalog: Catalog | None = None) -> None:
    """A job across boxes needs workers on several boxes, which share PostgreSQL; or a
    worker in front of a Slurm cluster, which may serve from one host beside SQLite."""
    slurm = catalog is not None and any(w.executor == "slurm" for w in catalog.workers)
    if spec.nodes > 1 and is_sqlite(engine) and not slurm:
        raise SpecInvalid.at(
            ("nodes",),
            "nodes > 1 spans several boxes, whose workers share one PostgreSQL database; "
            "this server's database is SQLite, which serves the workers of one box",
        )


def _check_running_quota(engine: Engine, owner: str, spec: JobCreate, settings: Settings) -> None:
    """A job needing more devices than its owner may hold at once would never start."""
    with read_session(engine) as session:
        own = session.exec(select(User.max_running_devices).where(User.name == owner)).first()
    if own is not None:
        limit, where = own, f"{owner}'s own limit"
    elif settings.max_running_devices_per_user is not None:
        limit, where = (
            settings.max_running_devices_per_user,
            "TRAINYARD_MAX_RUNNING_DEVICES_PER_USER",
        )
    else:
        return
    needed = spec.devices * spec.nodes
    if needed > limit:
        across = f" ({spec.nodes} nodes x {spec.devices})" if spec.nodes > 1 else ""
        raise SpecInvalid.at(
            ("devices",),
            f"the job needs {needed} devices{across}, more than {owner}'s running quota of "
            f"{limit} ({where}): it would wait forever; ask for at most {limit}, or ask an "
            "admin to raise the quota",
        )


def _check_queue_quota(engine: Engine, owner: str, limit: tuple[int, str]) -> None:
    with read_session(engine) as session:
        queued = store.queued_count(session, owner)
    users.check_queue_quota(owner, queued, limit)
