"""A job's own inputs (its code package and data files), checked before it is enqueued.

The blobs must be stored, row and file, and the package must pass ``check_package``; the
submit's transaction then attaches them (``service.store.submit``), which refuses the job
if one was removed in between. So a job in the queue always has what it needs to run.
"""

from __future__ import annotations

from sqlalchemy import Engine

from service import blob_rows
from service.blobs import BlobStore
from service.db import read_session
from service.errors import SpecInvalid
from service.jobspec import blob_uses, field_of
from service.models import JobCreate
from service.packages import RECIPES_MODULE, PackageLimits, check_package


def check_inputs(engine: Engine, blobs: BlobStore, limits: PackageLimits, spec: JobCreate) -> None:
    """Refuse (422) a job whose blobs are not all stored, or whose package is unsafe."""
    uses = blob_uses(spec)
    if not uses:
        return
    with read_session(engine) as session:
        rows = blob_rows.known(session, list(uses.values()))
    for role, digest in uses.items():
        if digest not in rows or blobs.size_of(digest) is None:
            raise SpecInvalid.at(
                field_of(role),
                f"blob {digest} is not stored: upload it first with PUT /api/v1/blobs/{digest}",
            )
    if spec.code is not None:
        summary = check_package(
            blobs.path(spec.code),
            max_files=limits.max_files,
            max_unpacked_bytes=limits.max_unpacked_bytes,
            max_bytes=limits.max_bytes,
        )
        if spec.recipe is not None and RECIPES_MODULE not in summary.names:
            raise SpecInvalid.at(
                ("code",),
                f"the job runs recipe {spec.recipe!r} from its code package, which has no "
                f"{RECIPES_MODULE} at its root to define it",
            )
