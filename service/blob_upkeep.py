"""Removing blobs, row and file together: a delete on request (refused while an unfinished
job uses the blob) and the periodic sweep of what no job has used for ``blob_ttl_s``.

Both lock the blob's row and decide again under the lock: a job attaching the blob
updates that row, so it either waits and is then refused (no row left), or commits first
and is seen.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Engine

from service import blob_rows
from service.blobs import STALE_TEMP_S, BlobStore
from service.db import read_session, write_session
from service.errors import BlobInUse, BlobNotFound
from service.models import utcnow
from service.settings import Settings

log = logging.getLogger(__name__)


def delete(engine: Engine, store: BlobStore, digest: str) -> None:
    """Delete a blob (row and file); BlobInUse while an unfinished job uses it."""
    with write_session(engine) as session:
        if blob_rows.lock(session, digest) is None:
            raise BlobNotFound(digest)
        users = blob_rows.unfinished_users(session, digest)
        if users:
            raise BlobInUse(digest, users)
        blob_rows.remove(session, digest)
        # Under the row's lock: a job attaching the blob meanwhile waits, then finds no
        # row and is refused; the file goes before the commit, so no row outlives it
        # (should the commit fail, the row stays without a file and a new PUT repairs it).
        store.remove(digest)


@dataclass(frozen=True)
class Swept:
    blobs: list[str]  # digests whose row and file were removed
    orphans: list[str]  # files with no row (a crash between rename and insert)
    temps: int  # temp files of uploads that never finished


def sweep(engine: Engine, settings: Settings, now: datetime | None = None) -> Swept:
    """Remove blobs no job has used for ``blob_ttl_s`` that no unfinished job uses,
    files that never got a row, and stale temp files. Cheap when nothing is due: one
    query on the blob table and two directory listings."""
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
    if removed or orphans or temps:
        log.info(
            "blob sweep: %d expired, %d without a row, %d stale temp files removed",
            len(removed),
            len(orphans),
            temps,
        )
    return Swept(removed, orphans, temps)
