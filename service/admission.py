"""Admission: the checks a job passes before it is enqueued, one order for every way in.

A submit and a rerun both call ``admit``, so a spec a submit refuses a rerun refuses with
the same status and words. In order: who may ask for it (403), whether this server can
run it at all (a job across boxes needs PostgreSQL) and whether a registered worker could
(422), the owner's limit on queued jobs (429), then its inputs (422). The inputs come
last because their check is the costly one (it reads the stored blobs and unpacks the
package): it runs only for a job that passed everything else.

Each refusal is a domain error, mapped to HTTP in the one handler of ``service.api``.
``admit`` runs on the event loop and hands a step to the thread pool only where it must
query: a submit the cached catalog accepts, by a user under no queue limit, with no code
of its own, holds no thread before its insert.
"""

from __future__ import annotations

from anyio import to_thread
from sqlalchemy import Engine

from service import store, users
from service.blobs import BlobStore
from service.catalog import CatalogCache
from service.db import is_sqlite, read_session
from service.errors import SpecInvalid
from service.inputs import check_inputs
from service.models import JobCreate
from service.packages import PackageLimits
from service.reasons import ReasonCode
from service.settings import Settings
from service.users import Identity


async def admit(
    spec: JobCreate,
    who: Identity,
    *,
    engine: Engine,
    catalogs: CatalogCache,
    settings: Settings,
    blobs: BlobStore,
) -> tuple[ReasonCode, str]:
    """Refuse a spec ``who`` may not enqueue now; else the reason the job waits with."""
    users.check_spec_rights(who, spec)
    _check_database(engine, spec)
    reason = catalogs.check_cached(spec)
    if reason is None:  # the cached catalog expired, or would refuse it: ask as of now
        reason = await to_thread.run_sync(catalogs.check, engine, spec)
    own_limits = users.OWN_LIMITS.cached()
    if own_limits is None:
        own_limits = await to_thread.run_sync(users.OWN_LIMITS.get, engine)
    queue_limit = users.queue_limit(own_limits, who.name, settings)
    if queue_limit is not None:
        await to_thread.run_sync(_check_queue_quota, engine, who.name, queue_limit)
    if spec.code is not None:  # its own code and data: stored, and the package safe
        # (data without code was refused with the catalog's check of the spec's shape)
        limits = PackageLimits.from_settings(settings)
        await to_thread.run_sync(check_inputs, engine, blobs, limits, spec)
    return reason


def _check_database(engine: Engine, spec: JobCreate) -> None:
    """A job across boxes needs workers on several boxes, which share PostgreSQL."""
    if spec.nodes > 1 and is_sqlite(engine):
        raise SpecInvalid.at(
            ("nodes",),
            "nodes > 1 spans several boxes, whose workers share one PostgreSQL database; "
            "this server's database is SQLite, which serves the workers of one box",
        )


def _check_queue_quota(engine: Engine, owner: str, limit: tuple[int, str]) -> None:
    with read_session(engine) as session:
        queued = store.queued_count(session, owner)
    users.check_queue_quota(owner, queued, limit)
