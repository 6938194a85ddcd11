"""The blobs' rows: the ``blob`` table (one row per stored digest), ``job_blob`` (which job
uses which blob, in which role), their API schemas, and every query about them.

The files themselves are ``service.blobs``'s. A row is written only once its file is in
place, so a row without a file is the only mismatch (a sweep or delete racing a PUT of the
same digest); ``HEAD``/``GET`` look at both, and a new PUT repairs it.

``blob_upload`` says who uploaded each: a user other than an admin sees the blobs they
uploaded and those their own jobs use (``visible``), and no others, not even that they
exist: a digest is all it takes to name someone's data.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, Index, delete, func, literal, or_, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlmodel import Field, Session, SQLModel, col, select

from service.errors import BlobNotFound
from service.models import DIGEST_MAX, USER_NAME_MAX, Job, JobStatus, UTCDateTime, utcnow

# A job in one of these still needs its blobs: they are neither deleted nor swept.
UNFINISHED = (JobStatus.queued, JobStatus.running, JobStatus.cancelling)


class Blob(SQLModel, table=True):
    """A stored blob: its digest (the file's name), size and when it was last used."""

    __tablename__ = "blob"
    __table_args__ = (Index("ix_blob_created_at", "created_at"),)  # the listing's order

    digest: str = Field(primary_key=True, max_length=DIGEST_MAX)
    size: int = Field(sa_type=BigInteger)  # data files pass 2 GiB: INTEGER is 32-bit
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    last_used_at: datetime | None = Field(None, sa_type=UTCDateTime)


class BlobUpload(SQLModel, table=True):
    """Who uploaded a blob. A digest names bytes, not a person: each user who PUT the same
    bytes has a row. An uploader may read and delete it (an admin any), and a blob stored
    before uploads were recorded has none."""

    __tablename__ = "blob_upload"
    __table_args__ = (Index("ix_blob_upload_uploader", "uploader"),)  # a user's own blobs

    digest: str = Field(primary_key=True, max_length=DIGEST_MAX)
    uploader: str = Field(primary_key=True, max_length=USER_NAME_MAX)
    uploaded_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)


class JobBlob(SQLModel, table=True):
    """A job's use of a blob. ``digest`` is no foreign key: the record of what a finished
    job used outlives the blob (it can be uploaded again under the same digest)."""

    __tablename__ = "job_blob"
    __table_args__ = (Index("ix_job_blob_digest", "digest"),)  # unfinished_users

    job_id: int = Field(foreign_key="job.id", primary_key=True, ondelete="CASCADE")
    digest: str = Field(primary_key=True, max_length=DIGEST_MAX)
    role: str = Field(primary_key=True, max_length=200)


class BlobUse(SQLModel):
    job_id: int
    role: str = Field(description='What the job uses it as: "code", or "data:<name>".')
    status: JobStatus


class BlobRead(SQLModel):
    """A blob's metadata, as the API shows it."""

    digest: str = Field(description="sha256:<64 lowercase hex>, the hash of its bytes.")
    size: int = Field(description="Bytes.")
    created_at: datetime
    last_used_at: datetime | None = Field(None, description="When a job last used it.")
    jobs: list[BlobUse] = Field(default_factory=list, description="Jobs that use it.")


class BlobList(SQLModel):
    items: list[BlobRead]
    total: int = Field(description="Blobs stored, all pages.")
    limit: int
    offset: int


def record(session: Session, digest: str, size: int, now: datetime | None = None) -> bool:
    """Insert the row of a blob whose file is in place; False if it was there already."""
    dialect = postgresql if session.get_bind().dialect.name == "postgresql" else sqlite
    # ON CONFLICT DO NOTHING: two uploads of one digest may finish at once.
    statement = (
        dialect.insert(Blob)
        .values(digest=digest, size=size, created_at=now or utcnow())
        .on_conflict_do_nothing(index_elements=["digest"])
    )
    return bool(session.exec(statement).rowcount)


def lock(session: Session, digest: str) -> Blob | None:
    """The blob's row, locked until the transaction ends (PostgreSQL; SQLite's write
    session already holds the database's one write lock)."""
    return session.exec(select(Blob).where(col(Blob.digest) == digest).with_for_update()).first()


def remove(session: Session, digest: str) -> None:
    """Delete the blob's row and its uploads (its uses stay, as the record of what jobs
    ran with)."""
    session.exec(delete(Blob).where(col(Blob.digest) == digest))
    session.exec(delete(BlobUpload).where(col(BlobUpload.digest) == digest))


def add_upload(session: Session, digest: str, uploader: str) -> None:
    """Record that ``uploader`` PUT the blob's bytes (once per user and blob)."""
    dialect = postgresql if session.get_bind().dialect.name == "postgresql" else sqlite
    statement = (
        dialect.insert(BlobUpload)
        .values(digest=digest, uploader=uploader, uploaded_at=utcnow())
        .on_conflict_do_nothing(index_elements=["digest", "uploader"])
    )
    session.exec(statement)


def remove_upload(session: Session, digest: str, uploader: str) -> None:
    """Forget that ``uploader`` uploaded the blob."""
    session.exec(
        delete(BlobUpload).where(
            col(BlobUpload.digest) == digest, col(BlobUpload.uploader) == uploader
        )
    )


def uploaders(session: Session, digest: str) -> list[str]:
    """Who uploaded the blob, by name (none for one stored before uploads were recorded)."""
    query = select(BlobUpload.uploader).where(col(BlobUpload.digest) == digest)
    return sorted(session.exec(query))


def visible(user: str) -> Any:
    """SQL: the blob is one ``user`` uploaded, or one of ``user``'s jobs uses."""
    uploaded = select(BlobUpload.digest).where(col(BlobUpload.uploader) == user)
    used = (
        select(JobBlob.digest)
        .join(Job, col(Job.id) == col(JobBlob.job_id))
        .where(col(Job.owner) == user)
    )
    return or_(col(Blob.digest).in_(uploaded), col(Blob.digest).in_(used))


def visible_of(session: Session, user: str, digests: list[str]) -> set[str]:
    """Which of these stored digests ``user`` may see."""
    query = select(Blob.digest).where(col(Blob.digest).in_(digests), visible(user))
    return set(session.exec(query))


def read(session: Session, digest: str) -> BlobRead:
    """A blob's metadata with the jobs that use it; BlobNotFound without a row."""
    blob = session.get(Blob, digest)
    if blob is None:
        raise BlobNotFound(digest)
    return _with_uses(session, [blob])[0]


def page(
    session: Session, *, limit: int, offset: int, viewer: str | None = None
) -> tuple[list[BlobRead], int]:
    """Blobs newest first, one page, and how many there are in all (those ``viewer`` may
    see; None: every blob)."""
    count = select(func.count()).select_from(Blob)
    query = select(Blob).order_by(col(Blob.created_at).desc(), col(Blob.digest))
    if viewer is not None:
        count, query = count.where(visible(viewer)), query.where(visible(viewer))
    total = session.exec(count).one()
    blobs = list(session.exec(query.limit(limit).offset(offset)))
    return _with_uses(session, blobs), int(total)


def _with_uses(session: Session, blobs: list[Blob]) -> list[BlobRead]:
    # One query for the page's uses, not one per blob.
    uses: dict[str, list[BlobUse]] = {b.digest: [] for b in blobs}
    query = (
        select(JobBlob.digest, JobBlob.job_id, JobBlob.role, Job.status)
        .join(Job, col(Job.id) == col(JobBlob.job_id))
        .where(col(JobBlob.digest).in_(list(uses)))
        .order_by(col(JobBlob.job_id).desc(), col(JobBlob.role))
    )
    for digest, job_id, role, status in session.exec(query):
        uses[digest].append(BlobUse(job_id=job_id, role=role, status=JobStatus(status)))
    return [BlobRead(**b.model_dump(), jobs=uses[b.digest]) for b in blobs]


def attach(session: Session, job_id: int, uses: Mapping[str, str]) -> None:
    """Record that a job uses these blobs (role -> digest) and mark them used now.

    Raises BlobNotFound for a digest with no row. The UPDATE locks the blobs' rows, so a
    delete or sweep that runs meanwhile waits for this transaction and then sees the job;
    one that ran first leaves no row to update, and the job is refused."""
    digests = set(uses.values())
    if not digests:
        return
    touched = session.exec(
        update(Blob).where(col(Blob.digest).in_(digests)).values(last_used_at=utcnow())
    ).rowcount
    if touched != len(digests):
        present = set(session.exec(select(Blob.digest).where(col(Blob.digest).in_(digests))))
        raise BlobNotFound(min(digests - present))
    for role, digest in uses.items():
        session.add(JobBlob(job_id=job_id, digest=digest, role=role))
    session.flush()


def unfinished_users(session: Session, digest: str) -> list[int]:
    """Ids of the queued, running or cancelling jobs that use the blob."""
    query = (
        select(JobBlob.job_id)
        .join(Job, col(Job.id) == col(JobBlob.job_id))
        .where(col(JobBlob.digest) == digest, col(Job.status).in_(UNFINISHED))
        .distinct()
        .order_by(col(JobBlob.job_id))
    )
    return list(session.exec(query))


def expired(session: Session, cutoff: datetime, digest: str | None = None) -> list[str]:
    """Digests of blobs unused since ``cutoff``: not created, attached or used by a job
    that finished after it, and used by no unfinished job."""
    in_use = (
        select(literal(1))
        .select_from(JobBlob)
        .join(Job, col(Job.id) == col(JobBlob.job_id))
        .where(
            col(JobBlob.digest) == col(Blob.digest),
            or_(col(Job.status).in_(UNFINISHED), col(Job.finished_at) >= cutoff),
        )
    )
    query: Any = select(Blob.digest).where(
        func.coalesce(col(Blob.last_used_at), col(Blob.created_at)) < cutoff, ~in_use.exists()
    )
    if digest is not None:
        query = query.where(col(Blob.digest) == digest)
    return list(session.exec(query))


def known(session: Session, digests: list[str]) -> set[str]:
    """Which of these digests have a row."""
    return set(session.exec(select(Blob.digest).where(col(Blob.digest).in_(digests))))
