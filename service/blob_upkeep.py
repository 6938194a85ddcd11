"""Removing blobs, row and file together: a delete on request (refused while an unfinished
job uses the blob) and the periodic sweep of what no job has used for ``blob_ttl_s``.

An admin deletes a blob; a user who uploaded it deletes their upload, and its bytes go
with the last uploader's (a blob stored before uploads were recorded has none: only an
admin deletes it). Every delete on request is audited, in the delete's transaction; the
sweep is no one's act, and says what it removed in the API's log.

Both lock the blob's row and decide again under the lock: a job attaching the blob
updates that row, so it either waits and is then refused (no row left), or commits first
and is seen.

With an object store, the blob's copy there goes too, after the commit (a store that
does not answer holds no lock meanwhile). A store that fails is logged, not fatal: each
sweep removes every copy there whose blob has no row, so a copy left behind goes then.
A PUT copies a blob to the store only once its row is committed, so that is never a
copy whose row is about to be written.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Engine

from service import audit, blob_rows
from service.audit import Action
from service.blobs import STALE_TEMP_S, BlobStore
from service.db import read_session, write_session
from service.errors import BlobInUse, BlobNotFound, NotAllowed
from service.models import utcnow
from service.objects.layout import blob_key
from service.objects.store import ObjectStore, StoreError
from service.settings import Settings
from service.users import Identity

log = logging.getLogger(__name__)

KNOWN_BATCH = 500  # digests per query for their rows (SQLite bounds a query's parameters)


def delete(
    engine: Engine,
    store: BlobStore,
    digest: str,
    who: Identity,
    objects: ObjectStore | None = None,
) -> None:
    """Delete a blob (row, file and the object store's copy), or ``who``'s upload of it;
    BlobInUse while an unfinished job uses what would go, BlobNotFound for a blob ``who``
    may not see."""
    with write_session(engine) as session:
        if blob_rows.lock(session, digest) is None:
            raise BlobNotFound(digest)
        uploaders = blob_rows.uploaders(session, digest)
        if not who.admin and who.name not in uploaders:
            if not blob_rows.visible_of(session, who.name, [digest]):
                raise BlobNotFound(digest)  # not even whether it exists
            raise NotAllowed(
                f"blob {digest} is used by a job of yours but was not uploaded by you: only "
                "a user who uploaded it, or an admin, may delete it"
            )
        others = [u for u in uploaders if u != who.name]
        if not who.admin and others:  # theirs stays: only this user's upload goes
            blob_rows.remove_upload(session, digest, who.name)
            audit.record(
                session, who.name, Action.blob_deleted, f"blob {digest}", bytes_removed=False
            )
            return
        users = blob_rows.unfinished_users(session, digest)
        if users:
            raise BlobInUse(digest, users)
        blob_rows.remove(session, digest)
        audit.record(
            session,
            who.name,
            Action.blob_deleted,
            f"blob {digest}",
            bytes_removed=True,
            uploaders=uploaders,
        )
        # Under the row's lock: a job attaching the blob meanwhile waits, then finds no
        # row and is refused; the file goes before the commit, so no row outlives it
        # (should the commit fail, the row stays without a file and a new PUT repairs it).
        store.remove(digest)
    if objects is not None:
        _remove_stored(objects, [digest])


@dataclass(frozen=True)
class Swept:
    blobs: list[str]  # digests whose row and file were removed
    orphans: list[str]  # files with no row (a crash between rename and insert)
    temps: int  # temp files of uploads that never finished


def sweep(
    engine: Engine,
    settings: Settings,
    now: datetime | None = None,
    *,
    objects: ObjectStore | None = None,
) -> Swept:
    """Remove blobs no job has used for ``blob_ttl_s`` that no unfinished job uses,
    files that never got a row, stale temp files, and the object store's copies of
    blobs with no row. Cheap when nothing is due: one query on the blob table and two
    directory listings (and a listing of the store's blobs)."""
    now = now or utcnow()
    store = BlobStore.from_settings(settings)
    cutoff = now - timedelta(seconds=settings.blob_ttl_s)
    with read_session(engine) as session:
        candidates = blob_rows.expired(session, cutoff)
    removed = []
    for digest in candidates:
        with write_session(engine) as session:
            # Again under the lock: a job may have attached it since the first look.
            locked = blob_rows.lock(session, digest) is not None
            if locked and blob_rows.expired(session, cutoff, digest):
                blob_rows.remove(session, digest)
                store.remove(digest)
                removed.append(digest)
    old_files = store.files_older_than(cutoff.timestamp())
    with read_session(engine) as session:
        orphans = sorted(set(old_files) - blob_rows.known(session, old_files))
    for digest in orphans:
        store.remove(digest)
    temps = store.remove_stale_temps(now.timestamp() - STALE_TEMP_S)
    if objects is not None:
        _remove_stored(objects, _stored_without_row(engine, objects))
    if removed or orphans or temps:
        log.info(
            "blob sweep: %d expired, %d without a row, %d stale temp files removed",
            len(removed),
            len(orphans),
            temps,
        )
    return Swept(removed, orphans, temps)


def _stored_without_row(engine: Engine, objects: ObjectStore) -> list[str]:
    """Digests of the store's blobs that have no row (deleted; their copy left behind)."""
    try:
        listed = ["sha256:" + s.key.rsplit("/", 1)[-1] for s in objects.listing(blob_key(""))]
    except StoreError as exc:
        log.warning("blob sweep: %s could not be listed, tried next time: %s", objects, exc)
        return []
    known: set[str] = set()
    with read_session(engine) as session:
        for start in range(0, len(listed), KNOWN_BATCH):
            known |= blob_rows.known(session, listed[start : start + KNOWN_BATCH])
    return [digest for digest in listed if digest not in known]


def _remove_stored(objects: ObjectStore, digests: list[str]) -> None:
    """The store's copies of these blobs; a store that fails is logged (the next sweep
    removes what is left)."""
    if not digests:
        return
    try:
        objects.delete([blob_key(digest) for digest in digests])
    except StoreError as exc:
        log.warning(
            "%d blobs' copies stay in %s until a sweep removes them: %s",
            len(digests),
            objects,
            exc,
        )
    else:
        log.info("%d blobs' copies removed from %s", len(digests), objects)
