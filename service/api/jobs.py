"""/api/v1/jobs: submit, list, inspect, cancel; metrics, logs and artifacts of a job.

One router: every route of one resource, /jobs/{id} and below; what they call is elsewhere
(admission, store, catalog, users)."""

from __future__ import annotations

import functools
import json
import logging
import mimetypes
from collections.abc import AsyncIterator, Iterator
from pathlib import PurePosixPath
from typing import Annotated, BinaryIO
from urllib.parse import quote

from fastapi import (
    APIRouter,
    Body,
    Depends,
    Header,
    HTTPException,
    Path,
    Query,
    Request,
    Response,
    status,
)
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import RedirectResponse, StreamingResponse
from fastapi.sse import KEEPALIVE_COMMENT, EventSourceResponse, format_sse_event
from sqlalchemy import Engine
from sqlmodel import col, select

from service import audit, store, users
from service.admission import Admitted, admit
from service.api.deps import (
    BlobStoreDep,
    CatalogDep,
    CatalogsDep,
    EngineDep,
    IdentityDep,
    ObjectsDep,
    OwnerFilter,
    PageLimit,
    PageOffset,
    SettingsDep,
    owner_named,
    pooled,
)
from service.api.errors import RETRY_AFTER_S
from service.api.responses import (
    GUARDED,
    JOB_NOT_FOUND,
    JSON_BODY,
    QUEUE_FULL,
    SPEC_REFUSED,
    WRITE,
    Responses,
    error,
)
from service.artifacts import ArtifactNotFound, ArtifactRead, list_artifacts, open_artifact
from service.audit import Action
from service.catalog import waiting_reason
from service.db import read_session
from service.events import HeldStream
from service.models import (
    JOB_EXAMPLE,
    MAX_INT32,
    SCRIPT_EXAMPLE,
    Job,
    JobCreate,
    JobList,
    JobNodeRead,
    JobRead,
    JobStatus,
    LogLine,
    LogLineRead,
    Metric,
    MetricRead,
    NulFreeStr,
)
from service.objects.store import ObjectMissing, ObjectStore, StoreError, StoreUnreachable
from service.stored_artifacts import find_stored, merged, stored_files
from service.users import Identity

log = logging.getLogger(__name__)

# An artifact streams in pieces this large (a checkpoint may be many GiB).
ARTIFACT_CHUNK_BYTES = 2**20
# Seconds a client refused an event stream waits before asking again.
STREAM_RETRY_AFTER_S = 10

router = APIRouter(prefix="/jobs", tags=["jobs"], responses=GUARDED)

# A job's id in a path: the id column is 32-bit on PostgreSQL, so a wider one names no job.
JobId = Annotated[int, Path(ge=1, le=MAX_INT32, description="The job's id.")]


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    summary="Submit a training job",
    responses=WRITE
    | JSON_BODY
    | SPEC_REFUSED
    | QUEUE_FULL
    | {409: error("Idempotency-Key reused with another spec")},
)
async def submit_job(
    spec: Annotated[
        JobCreate,
        Body(
            openapi_examples={
                "ddp": {"summary": "A recipe under DDP", "value": JOB_EXAMPLE},
                "script": {
                    "summary": "Your own script (upload its package and data first)",
                    "value": SCRIPT_EXAMPLE,
                },
            }
        ),
    ],
    response: Response,
    engine: EngineDep,
    catalogs: CatalogsDep,
    settings: SettingsDep,
    blobs: BlobStoreDep,
    who: IdentityDep,
    idempotency_key: Annotated[
        NulFreeStr | None,
        Header(max_length=200, description="Retries with the same key return the same job."),
    ] = None,
) -> JobRead:
    """Validate a job spec against the recipe catalog and enqueue it."""
    admitted = await admit(
        spec,
        who,
        engine=engine,
        catalogs=catalogs,
        settings=settings,
        blobs=blobs,
        idempotency_key=idempotency_key,
    )
    if idempotency_key is None and spec.code is None:
        job = await store.enqueue_job(
            engine, spec, admitted.reason, owner=who.name, queue_limit=admitted.queue_limit
        )
        created = True
    else:
        job, created = await run_in_threadpool(
            functools.partial(
                store.create_job,
                engine,
                spec,
                owner=who.name,
                idempotency_key=idempotency_key,
                reason=admitted.reason,
                queue_limit=admitted.queue_limit,
            )
        )
    response.headers["Location"] = f"/api/v1/jobs/{job.id}"
    if not created:
        response.headers["Idempotent-Replayed"] = "true"
    return JobRead.from_row(job)


@router.get("", summary="List jobs, newest first")
@pooled
def list_jobs(
    engine: EngineDep,
    who: IdentityDep,
    status_: Annotated[JobStatus | None, Query(alias="status")] = None,
    owner: OwnerFilter = None,
    sweep: Annotated[
        int | None, Query(ge=1, le=MAX_INT32, description="Only this sweep's trials.")
    ] = None,
    limit: PageLimit = 50,
    offset: PageOffset = 0,
) -> JobList:
    """Jobs, optionally of one status, one owner and one sweep, newest first. Everyone
    sees every job: a shared box is transparent."""
    owner = owner_named(who, owner)
    with read_session(engine) as session:
        rows, total = store.list_jobs(
            session, status=status_, owner=owner, sweep=sweep, limit=limit, offset=offset
        )
    return JobList(
        items=[JobRead.from_row(j) for j in rows], total=total, limit=limit, offset=offset
    )


@router.get("/{job_id}", summary="Get a job's status, reason and progress", responses=JOB_NOT_FOUND)
@pooled
def get_job(
    job_id: JobId, engine: EngineDep, catalog: CatalogDep, settings: SettingsDep
) -> JobRead:
    """One job, with its live progress and, while queued, its place in the queue (in fair
    share's order) and why it waits (devices, its owner's quota, other users' turn)."""
    with read_session(engine) as session:
        job = store.get_job(session, job_id)
        standing = store.queue_standing(
            session, job, max_running_devices=settings.max_running_devices_per_user
        )
        nodes = store.gang.nodes_of(session, [job_id]).get(job_id, []) if job.nodes > 1 else []
    read = JobRead.from_row(job, standing.position if standing is not None else None)
    if job.nodes > 1:
        read.node_list = [
            JobNodeRead(node=n.node, worker_id=n.worker_id, devices=n.devices) for n in nodes
        ]
    if standing is not None:
        read.reason = waiting_reason(catalog, job, standing.position, standing, joined=len(nodes))
    return read


@router.post(
    "/{job_id}/rerun",
    status_code=status.HTTP_201_CREATED,
    summary="Submit an identical job",
    responses=WRITE | JOB_NOT_FOUND | SPEC_REFUSED | QUEUE_FULL,
)
async def rerun_job(
    job_id: JobId,
    response: Response,
    engine: EngineDep,
    catalogs: CatalogsDep,
    settings: SettingsDep,
    blobs: BlobStoreDep,
    who: IdentityDep,
) -> JobRead:
    """A new job with this one's spec: recipe or code, params, data, seed and every other
    field, owned by whoever reran it (its owner, or an admin), admitted as a submit is. A
    script job's blobs must still be stored."""
    spec = await run_in_threadpool(_spec_to_rerun, engine, job_id, who)
    admitted = await admit(
        spec, who, engine=engine, catalogs=catalogs, settings=settings, blobs=blobs
    )
    job = await run_in_threadpool(_enqueue_rerun, engine, job_id, spec, who, admitted)
    response.headers["Location"] = f"/api/v1/jobs/{job.id}"
    return JobRead.from_row(job)


def _spec_to_rerun(engine: Engine, job_id: int, who: Identity) -> JobCreate:
    """The job's spec, if ``who`` may act on it (its owner, or an admin)."""
    with read_session(engine) as session:  # closed before waiting for the write lock
        original = store.get_job(session, job_id)
        users.check_may_act(who, original.owner, f"job {job_id}")
        return store.spec_of(original)


def _enqueue_rerun(
    engine: Engine, job_id: int, spec: JobCreate, who: Identity, admitted: Admitted
) -> Job:
    job, _ = store.create_job(
        engine,
        spec,
        owner=who.name,
        reason=admitted.reason,
        queue_limit=admitted.queue_limit,
    )
    audit.record_now(engine, who.name, Action.reran, f"job {job_id}", new_job=job.id)
    return job


@router.post(
    "/{job_id}/cancel",
    status_code=status.HTTP_202_ACCEPTED,
    summary="Cancel a job",
    responses=WRITE | JOB_NOT_FOUND | {409: error("The job already finished")},
)
@pooled
def cancel_job(job_id: JobId, engine: EngineDep, who: IdentityDep) -> JobRead:
    """Cancel a queued job now, or ask the worker to stop a running one (your own job, or
    any as an admin). Idempotent."""
    return JobRead.from_row(store.cancel_job(engine, job_id, who))


@router.get("/{job_id}/metrics", summary="A job's metric time series", responses=JOB_NOT_FOUND)
@pooled
def get_metrics(
    job_id: JobId,
    engine: EngineDep,
    name: Annotated[NulFreeStr | None, Query(max_length=100)] = None,
    after_step: Annotated[int, Query(ge=-1, le=MAX_INT32)] = -1,
    limit: Annotated[int, Query(ge=1, le=100_000)] = 10_000,
) -> list[MetricRead]:
    """Points ordered by step, optionally of one metric and after a step."""
    query = select(Metric).where(Metric.job_id == job_id, col(Metric.step) > after_step)
    if name is not None:
        query = query.where(Metric.name == name)
    with read_session(engine) as session:
        store.get_job(session, job_id)
        rows = session.exec(query.order_by(col(Metric.step), col(Metric.name)).limit(limit))
        return [MetricRead.model_validate(m, from_attributes=True) for m in rows]


@router.get("/{job_id}/logs", summary="A job's log lines", responses=JOB_NOT_FOUND)
@pooled
def get_logs(
    job_id: JobId,
    engine: EngineDep,
    after_seq: Annotated[int, Query(ge=0, le=MAX_INT32)] = 0,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
) -> list[LogLineRead]:
    """stdout/stderr lines of every process of the job, after a sequence number."""
    query = (
        select(LogLine)
        .where(LogLine.job_id == job_id, col(LogLine.seq) > after_seq)
        .order_by(col(LogLine.seq))
        .limit(limit)
    )
    with read_session(engine) as session:
        store.get_job(session, job_id)
        return [
            LogLineRead.model_validate(line, from_attributes=True) for line in session.exec(query)
        ]


def _job_exists(job_id: JobId, engine: EngineDep) -> None:
    """404 unless the job exists. For the event stream, a dependency: 404 before the stream
    starts, not inside it, from a session closed at once (not one held for the stream)."""
    with read_session(engine) as session:
        store.get_job(session, job_id)


@router.get(
    "/{job_id}/events",
    # returned as a response of its own (FastAPI's SSE generators encode per watcher)
    response_class=Response,
    responses=JOB_NOT_FOUND
    | {
        200: {"content": {"text/event-stream": {}}, "description": "The stream"},
        429: error("As many streams open as TRAINYARD_MAX_EVENT_STREAMS(_PER_USER) allow"),
    },
    summary="Watch a job live (Server-Sent Events)",
    dependencies=[Depends(_job_exists)],
)
async def job_events(
    job_id: JobId,
    request: Request,
    who: IdentityDep,
    settings: SettingsDep,
    last_event_id: Annotated[
        int | None,
        Header(
            ge=0,
            le=MAX_INT32,
            description="Resume after this event id (browsers send it on reconnect).",
        ),
    ] = None,
) -> EventSourceResponse:
    """`status` (the job), `progress`, `metric` and `log` events, each with an increasing
    id; from the job's start, or after `Last-Event-ID`, with no gap and no duplicate. The
    stream ends with an `end` event once the job has finished; `: ping` comments keep idle
    connections open. A user may keep TRAINYARD_MAX_EVENT_STREAMS_PER_USER open at once."""
    feeds = request.app.state.feeds
    refused = feeds.slots.take(
        who.name,
        per_user=settings.max_event_streams_per_user,
        in_all=settings.max_event_streams,
    )
    if refused is not None:  # streams end with their jobs: a slot comes free in a while
        raise HTTPException(429, refused, headers={"Retry-After": str(STREAM_RETRY_AFTER_S)})

    async def frames() -> AsyncIterator[bytes]:
        # Each event is encoded once, in the feed; a watcher writes a whole batch at once.
        async for batch in feeds.watch(job_id, last_event_id or 0):
            yield b"".join(event.frame for event in batch) if batch else KEEPALIVE_COMMENT
        yield format_sse_event(data_str=json.dumps({"job_id": job_id}), event="end")

    release = functools.partial(feeds.slots.give_back, who.name)
    return HeldStream(frames(), release, headers=_STREAM_HEADERS)


# Not cached by browsers; not buffered by nginx-style proxies.
_STREAM_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


# Where the store holds a job's files, the routes below may answer these too.
STORE_FAILED: Responses = {
    502: error("The object store refused the API's request (its credentials, its bucket)"),
    503: error(
        "The database or the object store is unreachable: try again after Retry-After seconds",
        headers={"Retry-After": {"schema": {"type": "integer"}, "example": RETRY_AFTER_S}},
    ),
}


# A download's answers of its own.
DOWNLOAD_ANSWERS: Responses = {
    200: {"content": {"application/octet-stream": {}}, "description": "Its bytes."},
    307: {
        "description": "With TRAINYARD_STORAGE_REDIRECT, an artifact only the object "
        "store holds: Location is a presigned URL of it, good for "
        "TRAINYARD_STORAGE_LINK_S seconds. Send no Authorization header there.",
        "headers": {"Location": {"schema": {"type": "string", "format": "uri"}}},
    },
    404: error("No such job, or it has no artifact of this name"),
}


@router.get(
    "/{job_id}/artifacts",
    summary="List a job's artifacts",
    responses=JOB_NOT_FOUND | STORE_FAILED,
)
@pooled
def get_artifacts(
    job_id: JobId, engine: EngineDep, settings: SettingsDep, objects: ObjectsDep
) -> list[ArtifactRead]:
    """Final model (model.safetensors), resolved spec (spec.json) and checkpoints: the
    files in this box's folder of the job and, with TRAINYARD_STORAGE_URL, those in the
    object store (its final artifacts and newest whole checkpoint, from whichever box ran
    it); this box's copy on a name both have. While the store is unreachable, this box's
    files alone; a 503 if it has none."""
    _job_exists(job_id, engine)
    local = list_artifacts(settings.data_dir, job_id)
    if objects is None:
        return local
    try:
        stored = stored_files(objects, job_id)
    except StoreError as exc:
        if not local:
            raise _store_failed(exc) from exc
        log.warning("job %s: its artifacts listed without the object store's: %s", job_id, exc)
        return local
    return merged(local, stored)


@router.get(
    "/{job_id}/artifacts/{name:path}",
    summary="Download an artifact",
    response_class=StreamingResponse,
    responses=DOWNLOAD_ANSWERS | STORE_FAILED,
)
def download_artifact(
    job_id: JobId,
    name: NulFreeStr,
    engine: EngineDep,
    settings: SettingsDep,
    objects: ObjectsDep,
    sec_fetch_site: Annotated[str | None, Header(include_in_schema=False)] = None,
) -> Response:
    """The artifact's bytes: from this box's folder of the job, else (with
    TRAINYARD_STORAGE_URL) from the object store, streamed through the API or, with
    TRAINYARD_STORAGE_REDIRECT, by a redirect to the store itself. A browser's request
    (the dashboard's, which sends its token in a header) is streamed either way: a page
    following the redirect would need the bucket to allow its origin (CORS)."""
    _job_exists(job_id, engine)
    try:
        file, size = open_artifact(settings.data_dir, job_id, name)
    except ArtifactNotFound:
        if objects is None:
            raise
        redirect = settings.storage_redirect and sec_fetch_site is None
        return _from_store(objects, job_id, name, link_s=settings.storage_link_s if redirect else 0)
    return StreamingResponse(
        _chunks(file), media_type=_media_type(name), headers=_saved_as(name, size)
    )


def _from_store(objects: ObjectStore, job_id: int, name: str, *, link_s: int) -> Response:
    """Artifact ``name`` from the store: a redirect to a link good for ``link_s`` seconds,
    or (``link_s`` 0) its bytes streamed. Blocks on the store: called in the pool."""
    try:
        stored = find_stored(objects, job_id, name)
        if link_s:
            filename = PurePosixPath(name).name
            url = objects.presign(stored.key, filename=filename, expires_s=link_s)
            # The link is a credential while it lasts: no cache keeps the answer.
            return RedirectResponse(url, status_code=307, headers={"Cache-Control": "no-store"})
        pieces, size = objects.stream(stored.key)
    except ObjectMissing as exc:  # dropped since its manifest was read (a newer checkpoint)
        raise ArtifactNotFound(f"job {job_id} has no artifact {name!r}") from exc
    except StoreError as exc:
        raise _store_failed(exc) from exc
    return StreamingResponse(pieces, media_type=_media_type(name), headers=_saved_as(name, size))


def _store_failed(exc: StoreError) -> HTTPException:
    """A store that did not answer: 503, try again later; one that refused: 502."""
    if isinstance(exc, StoreUnreachable):
        detail = f"the object store is unreachable; try again in a while ({exc})"
        return HTTPException(503, detail, headers={"Retry-After": str(RETRY_AFTER_S)})
    return HTTPException(502, f"the object store refused the API's request: {exc}")


def _media_type(name: str) -> str:
    return mimetypes.guess_type(name)[0] or "application/octet-stream"


def _saved_as(name: str, size: int) -> dict[str, str]:
    """A download's length, and the file name a browser saves it under."""
    filename = quote(PurePosixPath(name).name)
    return {
        "Content-Length": str(size),
        "Content-Disposition": f"attachment; filename*=utf-8''{filename}",
    }


def _chunks(file: BinaryIO) -> Iterator[bytes]:
    """The open file in chunks, closed at its end or when the client goes away."""
    with file:
        while chunk := file.read(ARTIFACT_CHUNK_BYTES):
            yield chunk
