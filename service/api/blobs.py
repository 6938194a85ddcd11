"""/api/v1/blobs: content-addressed uploads (code packages, data files) and their metadata.

``PUT`` streams the body to disk as it arrives (``service.blobs.BlobStore.receive``): the
app's JSON body limit does not apply here, ``TRAINYARD_MAX_BLOB_BYTES`` does, and the
token is checked (a router dependency) before a byte of the body is read.

A user other than an admin sees only the blobs they uploaded or their own jobs use; any
other digest is 404, as if nothing were stored under it. A PUT makes its sender an
uploader of the blob: of bytes stored already, only once it has sent them (and they hash
to the digest).

With an object store (``TRAINYARD_STORAGE_URL``) a PUT also copies the blob there, before
answering, where workers on other boxes fetch it from; a store that fails leaves the
answer as it was, and those workers fetch through the API.
"""

from __future__ import annotations

import logging
from typing import Annotated, Any

from fastapi import APIRouter, Header, Path, Request, Response, status
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import FileResponse
from sqlalchemy import Engine

from service import blob_rows, blob_upkeep
from service.api.deps import (
    BlobStoreDep,
    EngineDep,
    IdentityDep,
    ObjectsDep,
    PageLimit,
    PageOffset,
    SettingsDep,
    pooled,
)
from service.api.responses import BLOB_NOT_FOUND, GUARDED, WRITE, error
from service.blob_rows import BlobList, BlobRead
from service.blobs import MAX_BLOB_SETTING, BlobStore
from service.db import read_session, write_session
from service.errors import BlobNotFound, BlobTooLarge
from service.models import DIGEST_PATTERN, MAX_INT64
from service.objects.store import ObjectStore, StoreError
from service.users import Identity

log = logging.getLogger(__name__)

router = APIRouter(prefix="/blobs", tags=["blobs"], responses=GUARDED)


Digest = Annotated[
    str,
    Path(
        pattern=DIGEST_PATTERN,
        description="sha256: and the 64 lowercase hex digits of the bytes' SHA-256.",
        examples=["sha256:" + "0" * 64],
    ),
]

# Swagger's "Try it out" offers a file picker for a binary body declared this way; the
# route reads the raw stream itself, so FastAPI has no body parameter to describe.
_RAW_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "description": "The blob's bytes, exactly; their SHA-256 must be the digest.",
        "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
    }
}


@router.put(
    "/{digest}",
    status_code=status.HTTP_201_CREATED,
    summary="Upload a blob",
    openapi_extra=_RAW_BODY,
    responses=WRITE
    | {
        200: {
            "description": "Stored already: the body was not read if you had uploaded it "
            "(else it was, and had to match)",
            "model": BlobRead,
        },
        400: error("The body's SHA-256 is not the digest; nothing stored"),
        413: error("Larger than TRAINYARD_MAX_BLOB_BYTES; nothing stored"),
        507: error("The blob disk is full; nothing stored"),
    },
)
async def put_blob(
    digest: Digest,
    request: Request,
    response: Response,
    engine: EngineDep,
    settings: SettingsDep,
    store: BlobStoreDep,
    objects: ObjectsDep,
    who: IdentityDep,
    content_length: Annotated[
        int | None, Header(ge=0, le=MAX_INT64, include_in_schema=False)
    ] = None,
) -> BlobRead:
    """Store the raw body under its SHA-256, streamed to disk, kept only if it matches."""
    limit = settings.max_blob_bytes
    if content_length is not None and content_length > limit:
        raise BlobTooLarge(limit, MAX_BLOB_SETTING)  # refused before reading a byte
    # Its uploaders (and admins) need not send it again; anyone else proves they have the
    # bytes by sending them, and becomes an uploader, who may delete it. Seeing a blob (a
    # job of theirs uses it) is not enough: of a blob stored before uploads were recorded
    # only an admin may delete.
    uploaded = who.admin or await run_in_threadpool(_uploaded, engine, who, digest)
    received = await store.receive(request.stream(), digest, limit, prove=not uploaded)
    await run_in_threadpool(_record, engine, digest, received.size, who.name)
    if objects is not None:  # after its row: a store's copy without one is the sweep's
        await run_in_threadpool(_copy_to_store, store, objects, digest)
    response.headers["Location"] = f"/api/v1/blobs/{digest}"
    if not received.created:
        response.status_code = status.HTTP_200_OK
    return await run_in_threadpool(_read, engine, digest)


def _record(engine: Engine, digest: str, size: int, uploader: str) -> None:
    # Also when the file was there already: its row may be what a crash left missing.
    with write_session(engine) as session:
        blob_rows.record(session, digest, size)
        blob_rows.add_upload(session, digest, uploader)


def _copy_to_store(store: BlobStore, objects: ObjectStore, digest: str) -> None:
    """Where workers on other boxes fetch it; should the store fail, they use the API."""
    try:
        store.copy_to(objects, digest)
    except (StoreError, FileNotFoundError) as exc:  # unreachable, or deleted meanwhile
        log.warning("blob %s was not copied to %s: %s", digest, objects, exc)


def _uploaded(engine: Engine, who: Identity, digest: str) -> bool:
    with read_session(engine) as session:
        return who.name in blob_rows.uploaders(session, digest)


def _read(engine: Engine, digest: str) -> BlobRead:
    with read_session(engine) as session:
        return blob_rows.read(session, digest)


def _may_see(engine: Engine, who: Identity, digest: str) -> bool:
    """An admin sees every blob; a user those they uploaded and those their jobs use."""
    if who.admin:
        return True
    with read_session(engine) as session:
        return bool(blob_rows.visible_of(session, who.name, [digest]))


@router.head(
    "/{digest}",
    summary="Whether a blob is stored",
    response_class=Response,  # no body: the answer is the status and X-Blob-Size
    responses={404: {"description": "Not stored: upload it"}},
)
@pooled
def head_blob(digest: Digest, engine: EngineDep, store: BlobStoreDep, who: IdentityDep) -> Response:
    """200 (its size in X-Blob-Size) when stored, 404 when not: upload only what is missing."""
    size = store.size_of(digest)
    with read_session(engine) as session:
        stored = size is not None and bool(blob_rows.known(session, [digest]))
    if not stored or not _may_see(engine, who, digest):
        return Response(status_code=status.HTTP_404_NOT_FOUND)
    return Response(headers={"X-Blob-Size": str(size)})


@router.get("/{digest}", summary="A blob's metadata", responses=BLOB_NOT_FOUND)
@pooled
def get_blob(digest: Digest, engine: EngineDep, store: BlobStoreDep, who: IdentityDep) -> BlobRead:
    """Size, when it was stored and last used, and the jobs that use it."""
    if store.size_of(digest) is None or not _may_see(engine, who, digest):
        raise BlobNotFound(digest)
    return _read(engine, digest)


@router.get(
    "/{digest}/content",
    summary="Download a blob",
    response_class=FileResponse,
    responses=BLOB_NOT_FOUND | {200: {"content": {"application/octet-stream": {}}}},
)
async def download_blob(
    digest: Digest, engine: EngineDep, store: BlobStoreDep, who: IdentityDep
) -> FileResponse:
    """The blob's bytes, as uploaded (a worker on another box fetches what it lacks)."""
    path = store.path(digest)
    if not path.is_file():
        raise BlobNotFound(digest)
    if not (who.admin or await run_in_threadpool(_may_see, engine, who, digest)):
        raise BlobNotFound(digest)
    return FileResponse(path, media_type="application/octet-stream")


@router.get("", summary="List blobs, newest first")
@pooled
def list_blobs(
    engine: EngineDep,
    who: IdentityDep,
    limit: PageLimit = 50,
    offset: PageOffset = 0,
) -> BlobList:
    """Stored blobs with their metadata, newest first, one page: an admin's every blob, a
    user's those they uploaded or their jobs use."""
    viewer = None if who.admin else who.name
    with read_session(engine) as session:
        items, total = blob_rows.page(session, limit=limit, offset=offset, viewer=viewer)
    return BlobList(items=items, total=total, limit=limit, offset=offset)


@router.delete(
    "/{digest}",
    status_code=status.HTTP_204_NO_CONTENT,
    summary="Delete a blob",
    responses=WRITE | BLOB_NOT_FOUND | {409: error("An unfinished job uses it")},
)
@pooled
def delete_blob(
    digest: Digest,
    engine: EngineDep,
    store: BlobStoreDep,
    objects: ObjectsDep,
    who: IdentityDep,
) -> Response:
    """Delete a blob no unfinished job uses (finished jobs keep the record of its digest):
    an admin any, a user their own upload of it (its bytes go with its last uploader's)."""
    blob_upkeep.delete(engine, store, digest, who, objects)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
