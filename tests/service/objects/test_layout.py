"""Checkpoint and artifact manifests against a real S3-compatible server (moto)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from service.objects.layout import (
    KEEP_MANIFESTS,
    Manifest,
    StoredFile,
    artifact_key,
    checkpoint_file_key,
    manifests_prefix,
    newest_checkpoint,
    publish_artifacts,
    publish_checkpoint,
    stored_artifacts,
)
from service.objects.store import ObjectStore
from tests.object_store import S3Server

JOB = 7


def upload(store: ObjectStore, name: str, data: bytes, job_id: int = JOB) -> StoredFile:
    """One checkpoint file whole in the store, as a worker uploads it before its manifest."""
    key = checkpoint_file_key(job_id, name)
    store.put_bytes(key, data)
    return StoredFile(name=name, key=key, size=len(data))


def keys(store: ObjectStore, prefix: str = "") -> set[str]:
    return {s.key for s in store.listing(prefix)}


def test_no_manifest_no_checkpoint(s3: S3Server) -> None:
    store = s3.store()
    assert newest_checkpoint(store, JOB) is None
    assert stored_artifacts(store, JOB) is None


def test_the_newest_manifest_is_the_last_published(s3: S3Server) -> None:
    store = s3.store()
    first = Manifest(job_id=JOB, files=[upload(store, "model.pt", b"1")])
    second = Manifest(job_id=JOB, files=[upload(store, "model.pt", b"22")])
    publish_checkpoint(store, first)
    publish_checkpoint(store, second)
    assert newest_checkpoint(store, JOB) == second

    third = Manifest(job_id=JOB, files=[upload(store, "model.pt", b"333")])
    publish_checkpoint(store, third)
    newest = newest_checkpoint(store, JOB)
    assert newest == third
    assert newest.by_name()["model.pt"].size == 3


def test_a_later_attempt_sorts_after_an_earlier_one(s3: S3Server) -> None:
    store = s3.store()
    publish_checkpoint(store, Manifest(job_id=JOB, attempt=2, node=0))
    publish_checkpoint(store, Manifest(job_id=JOB, attempt=10, node=1))
    newest = newest_checkpoint(store, JOB)
    assert newest is not None and (newest.attempt, newest.node) == (10, 1)


def test_pruning_keeps_the_newest_and_what_they_name(s3: S3Server) -> None:
    store = s3.store()
    shared = upload(store, "config.json", b"{}")  # unchanged: every manifest names it
    stray = f"jobs/{JOB}/checkpoints/files/cut-short/model.pt"  # an upload no manifest names
    store.put_bytes(stray, b"half")
    published = []
    for n in range(KEEP_MANIFESTS + 2):
        files = [shared, upload(store, "model.pt", bytes([n]) * (n + 1))]
        published.append(Manifest(job_id=JOB, files=files))
        publish_checkpoint(store, published[-1])

    manifests = store.listing(manifests_prefix(JOB))
    assert len(manifests) == KEEP_MANIFESTS
    assert newest_checkpoint(store, JOB) == published[-1]
    kept = {f.key for m in published[-KEEP_MANIFESTS:] for f in m.files}
    dropped = {f.key for m in published[:-KEEP_MANIFESTS] for f in m.files} - kept
    assert shared.key in kept and dropped
    files = keys(store, f"jobs/{JOB}/checkpoints/files/")
    assert kept <= files, "every object a kept manifest names is there"
    assert not dropped & files, "objects only the dropped manifests named are gone"
    assert stray in files, "no manifest named it: maybe one about to be written"


def test_pruning_one_job_leaves_another_alone(s3: S3Server) -> None:
    store = s3.store()
    other = Manifest(job_id=JOB + 1, files=[upload(store, "model.pt", b"o", job_id=JOB + 1)])
    publish_checkpoint(store, other)
    for n in range(KEEP_MANIFESTS + 1):
        publish_checkpoint(store, Manifest(job_id=JOB, files=[upload(store, "m", bytes([n]))]))
    assert newest_checkpoint(store, JOB + 1) == other
    assert other.files[0].key in keys(store)


def test_a_manifest_of_another_job_is_passed_over(s3: S3Server) -> None:
    store = s3.store()
    good = Manifest(job_id=JOB, files=[upload(store, "model.pt", b"good")])
    publish_checkpoint(store, good)
    # the newest under this job's prefix, yet another job's: a bucket edited by hand
    wrong = Manifest(job_id=JOB + 1, attempt=1)
    store.put_bytes(
        f"{manifests_prefix(JOB)}000009-{0:020d}-node0.json", wrong.model_dump_json().encode()
    )
    assert newest_checkpoint(store, JOB) == good


@pytest.mark.parametrize(
    "damage", [b"{not json", b'{"job_id": "seven"}', b"[]", b"", b'{"files": []}']
)
def test_an_unreadable_manifest_is_passed_over(s3: S3Server, damage: bytes) -> None:
    store = s3.store()
    good = Manifest(job_id=JOB, files=[upload(store, "model.pt", b"good")])
    publish_checkpoint(store, good)
    store.put_bytes(f"{manifests_prefix(JOB)}000009-{0:020d}-node0.json", damage)
    assert newest_checkpoint(store, JOB) == good


def test_only_unreadable_manifests_is_no_checkpoint(s3: S3Server) -> None:
    store = s3.store()
    store.put_bytes(f"{manifests_prefix(JOB)}000000-{0:020d}-node0.json", b"nope")
    assert newest_checkpoint(store, JOB) is None


def test_a_damaged_kept_manifest_stops_pruning(s3: S3Server) -> None:
    """What a damaged manifest named is unknown: nothing is deleted rather than a guess."""
    store = s3.store()
    first = Manifest(job_id=JOB, files=[upload(store, "model.pt", b"1")])
    publish_checkpoint(store, first)
    # damaged, and newer than anything published below (attempt 999999)
    store.put_bytes(f"{manifests_prefix(JOB)}999999-{0:020d}-node0.json", b"nope")
    for n in range(KEEP_MANIFESTS):
        publish_checkpoint(store, Manifest(job_id=JOB, files=[upload(store, "m", bytes([n]))]))
    assert len(store.listing(manifests_prefix(JOB))) == KEEP_MANIFESTS + 2
    assert first.files[0].key in keys(store)


def test_artifacts_are_there_once_their_manifest_is(s3: S3Server) -> None:
    store = s3.store()
    key = artifact_key(JOB, "output/model.pt")
    store.put_bytes(key, b"weights")
    assert stored_artifacts(store, JOB) is None, "uploaded, not yet published"
    artifacts = Manifest(job_id=JOB, files=[StoredFile(name="output/model.pt", key=key, size=7)])
    publish_artifacts(store, artifacts)
    assert stored_artifacts(store, JOB) == artifacts
    assert stored_artifacts(store, JOB + 1) is None


def test_artifacts_of_another_job_are_not_this_jobs(s3: S3Server) -> None:
    store = s3.store()
    publish_artifacts(store, Manifest(job_id=JOB + 1))
    store.put_bytes(
        f"jobs/{JOB}/artifacts.json", Manifest(job_id=JOB + 1).model_dump_json().encode()
    )
    assert stored_artifacts(store, JOB) is None


@pytest.mark.parametrize(
    "name", ["", "/etc/passwd", "..", "../up", "a/../../up", "a/..", ".", "./", "/"]
)
def test_a_stored_file_refuses_names_outside_its_folder(name: str) -> None:
    with pytest.raises(ValidationError, match="not a relative path"):
        StoredFile(name=name, key="k", size=1)


@pytest.mark.parametrize("name", ["model.pt", "output/weights/model.pt", "a..b", ".hidden"])
def test_a_stored_file_takes_relative_names(name: str) -> None:
    assert StoredFile(name=name, key="k", size=1).name == name


def test_a_stored_file_refuses_a_negative_size() -> None:
    with pytest.raises(ValidationError):
        StoredFile(name="a", key="k", size=-1)
