"""What a job keeps in the object store, and the manifests that say which of it is whole.

    jobs/<id>/checkpoints/files/<uuid>/<name>     one version of a checkpoint file
    jobs/<id>/checkpoints/manifests/<attempt>-<seq>-<ns>-node<n>.json
                                                  a checkpoint folder as it was at one
                                                  moment: its files' names, keys, sizes
    jobs/<id>/artifacts/<uuid>/<name>             the final weights, spec.json, output/
    jobs/<id>/artifacts.json                      which artifacts are whole
    blobs/sha256/<hex>                            a blob (code package, data file)

A manifest is written last, after every object it names is whole in the store (an S3
object appears whole once its upload completes, never in part): a worker killed
mid-upload leaves objects no manifest names, never a manifest naming a missing object.
So the newest manifest is the newest whole checkpoint, and a resumed attempt on any box
downloads what it names. Manifest names sort in the order they were written (the
attempt; then one more than the manifest its writer resumed from or wrote last, so a job
handed back to another box under the same attempt number sorts after whatever clock that
box keeps; then nanoseconds), so the newest is the last key listed.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Iterator
from pathlib import PurePosixPath

from pydantic import BaseModel, Field, ValidationError, field_validator

from service.objects.store import ObjectMissing, ObjectStore, StoreError

log = logging.getLogger(__name__)

MANIFEST_LIMIT = 4 * 1024 * 1024  # bytes a manifest may hold (thousands of files' names)
KEEP_MANIFESTS = 2  # the newest whole checkpoint and the one before, should it not load


class StoredFile(BaseModel):
    """One file of a checkpoint folder or of a job's artifacts, and its object."""

    name: str = Field(max_length=1024)  # relative to its folder, with / between parts
    key: str = Field(max_length=1024)
    size: int = Field(ge=0)

    @field_validator("name")
    @classmethod
    def _relative(cls, name: str) -> str:
        """A name from the store is read as a path below a folder: nothing else."""
        parts = PurePosixPath(name).parts
        if not parts or name.startswith("/") or any(p in ("..", ".") for p in parts):
            raise ValueError(f"not a relative path: {name!r}")
        return name


class Manifest(BaseModel):
    """A set of files that is whole in the store."""

    id: str = Field(default_factory=lambda: uuid.uuid4().hex, max_length=64)  # this one's
    job_id: int
    attempt: int = 0
    # one more than the manifest its writer resumed from or wrote before: orders the
    # manifests of one attempt number (kept by a job handed back) across boxes' clocks
    seq: int = Field(0, ge=0, lt=10**9)
    node: int = 0
    written_at: float = 0.0  # seconds since the epoch, on the writing box's clock
    files: list[StoredFile] = Field(default_factory=list)

    def by_name(self) -> dict[str, StoredFile]:
        return {f.name: f for f in self.files}


def job_prefix(job_id: int) -> str:
    return f"jobs/{job_id}/"


def checkpoint_file_key(job_id: int, name: str) -> str:
    """A new key for one version of a checkpoint file (a file rewritten under the same
    name gets another: an older manifest's objects never change)."""
    return f"jobs/{job_id}/checkpoints/files/{uuid.uuid4().hex}/{name}"


def manifests_prefix(job_id: int) -> str:
    return f"jobs/{job_id}/checkpoints/manifests/"


def artifact_key(job_id: int, name: str) -> str:
    """A new key for one upload of artifact ``name``: a later attempt's upload never
    changes an object the published artifacts manifest names."""
    return f"jobs/{job_id}/artifacts/{uuid.uuid4().hex}/{name}"


def artifacts_manifest_key(job_id: int) -> str:
    return f"jobs/{job_id}/artifacts.json"


def blob_key(digest: str) -> str:
    """A blob's key, by its digest (``sha256:<hex>``); ``blob_key("")`` is their folder."""
    return f"blobs/sha256/{digest.removeprefix('sha256:')}"


def publish_checkpoint(store: ObjectStore, manifest: Manifest) -> str:
    """Write a checkpoint folder's manifest (its files already whole in the store), then
    drop all but the newest ``KEEP_MANIFESTS`` and the objects only they named."""
    written_ns = time.time_ns()
    key = (
        f"{manifests_prefix(manifest.job_id)}{manifest.attempt:06d}-{manifest.seq:09d}"
        f"-{written_ns:020d}-node{manifest.node}.json"
    )
    store.put_bytes(key, manifest.model_dump_json().encode())
    _prune(store, manifest.job_id)
    return key


def newest_checkpoint(store: ObjectStore, job_id: int) -> Manifest | None:
    """The newest manifest that reads, or None when the job has none. A damaged one (it
    cannot be: manifests are written whole; but a person may have edited the bucket) is
    passed over for the one before."""
    return next(checkpoints_newest_first(store, job_id), None)


def checkpoints_newest_first(store: ObjectStore, job_id: int) -> Iterator[Manifest]:
    """The manifests that read, newest first (a restore that finds one's objects gone
    takes the one before)."""
    for stored in reversed(store.listing(manifests_prefix(job_id))):
        try:
            manifest = _read(store, stored.key, job_id)
        except ObjectMissing:  # pruned since it was listed: an older one follows
            continue
        if manifest is not None:
            yield manifest


def stored_artifacts(store: ObjectStore, job_id: int) -> Manifest | None:
    """The job's final artifacts, once they are whole in the store."""
    key = artifacts_manifest_key(job_id)
    if store.size(key) is None:
        return None
    return _read(store, key, job_id)


def publish_artifacts(store: ObjectStore, manifest: Manifest) -> None:
    """Make ``manifest`` (its files whole in the store) the job's artifacts, then drop the
    objects only the one it replaces named."""
    before = stored_artifacts(store, manifest.job_id)
    store.put_bytes(artifacts_manifest_key(manifest.job_id), manifest.model_dump_json().encode())
    if before is not None:
        kept = {f.key for f in manifest.files}
        store.delete(sorted({f.key for f in before.files} - kept))


def _read(store: ObjectStore, key: str, job_id: int) -> Manifest | None:
    try:
        manifest = Manifest.model_validate_json(store.get_bytes(key, limit=MANIFEST_LIMIT))
    except (ValidationError, json.JSONDecodeError, StoreError) as exc:
        if not isinstance(exc, StoreError) or type(exc) is StoreError:
            log.warning("job %s: manifest %s is unreadable, passed over: %s", job_id, key, exc)
            return None
        raise  # unreachable, or gone meanwhile: the caller's to handle
    if manifest.job_id != job_id or any(
        not f.key.startswith(job_prefix(job_id)) for f in manifest.files
    ):  # a bucket edited by hand: nothing outside this job's keys is read, or pruned
        log.warning("job %s: manifest %s names another job's keys, passed over", job_id, key)
        return None
    return manifest


def _prune(store: ObjectStore, job_id: int) -> None:
    """Manifests past the newest few, then the objects they named that no kept manifest
    names: in that order, so a kept manifest never names a missing object. Objects no
    manifest names (an upload cut short) are left alone: they may be a manifest's about to
    be written."""
    listed = store.listing(manifests_prefix(job_id))
    old, kept = listed[:-KEEP_MANIFESTS], listed[-KEEP_MANIFESTS:]
    if not old:
        return
    named: set[str] = set()
    for stored in kept:
        manifest = _read(store, stored.key, job_id)
        if manifest is None:
            return  # keep everything rather than guess what a damaged one named
        named.update(f.key for f in manifest.files)
    dropped: set[str] = set()
    for stored in old:
        manifest = _read(store, stored.key, job_id)
        if manifest is not None:
            dropped.update(f.key for f in manifest.files)
    store.delete([s.key for s in old])
    store.delete(sorted(dropped - named))
