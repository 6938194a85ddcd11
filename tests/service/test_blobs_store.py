"""Blobs with an object store (the real moto server): a PUT copies the blob there, a
delete and the sweep remove the copy, and a store that is down fails none of them."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text

from service import blob_upkeep
from service.app import create_app
from service.blobs import BlobStore
from service.models import utcnow
from service.objects.layout import blob_key
from service.objects.store import ObjectMissing, ObjectStore
from service.settings import Settings
from tests.object_store import S3Server
from tests.service.test_blobs import API, digest_of
from tests.stack import wait_for

LIMIT = 1024 * 1024


@pytest.fixture
def stored_settings(settings: Settings, s3: S3Server) -> Settings:
    return settings.model_copy(update={"max_blob_bytes": LIMIT, "storage_url": s3.url})


@pytest.fixture
def api(stored_settings: Settings, db: Engine) -> Iterator[TestClient]:
    with TestClient(create_app(stored_settings, db)) as client:
        yield client


@pytest.fixture
def objects(s3: S3Server) -> ObjectStore:
    return s3.store()


def in_store(objects: ObjectStore, digest: str) -> bytes | None:
    try:
        return objects.get_bytes(blob_key(digest), limit=LIMIT)
    except ObjectMissing:
        return None


def test_an_upload_is_copied_to_the_store(api: TestClient, objects: ObjectStore) -> None:
    data = b"a code package's bytes" * 100
    digest = digest_of(data)
    assert api.put(f"{API}/{digest}", content=data).status_code == 201
    assert in_store(objects, digest) == data
    assert objects.listing("blobs/") == [objects.listing(blob_key(digest))[0]]  # that alone


def test_a_blob_stored_here_but_missing_there_is_copied_by_the_next_put(
    api: TestClient, objects: ObjectStore
) -> None:
    data = b"stored here, lost there"
    digest = digest_of(data)
    assert api.put(f"{API}/{digest}", content=data).status_code == 201
    objects.delete([blob_key(digest)])
    assert api.put(f"{API}/{digest}", content=data).status_code == 200  # stored already
    assert in_store(objects, digest) == data


def test_a_delete_removes_the_stores_copy(api: TestClient, objects: ObjectStore) -> None:
    data = b"to be deleted"
    digest = digest_of(data)
    api.put(f"{API}/{digest}", content=data)
    assert in_store(objects, digest) == data
    assert api.delete(f"{API}/{digest}").status_code == 204
    assert in_store(objects, digest) is None


def test_the_sweep_removes_the_copies_of_expired_and_deleted_blobs(
    api: TestClient, db: Engine, stored_settings: Settings, objects: ObjectStore
) -> None:
    expired, kept = b"unused for long", b"used lately"
    for data in (expired, kept):
        api.put(f"{API}/{digest_of(data)}", content=data)
    left_behind = b"a copy a failed delete left"  # in the store, without a row
    objects.put_bytes(blob_key(digest_of(left_behind)), left_behind)
    later = utcnow() + timedelta(seconds=stored_settings.blob_ttl_s + 60)
    # only the first is expired then: the second is used again meanwhile
    with db.begin() as conn:
        conn.execute(
            text("UPDATE blob SET last_used_at = :later WHERE digest = :digest"),
            {"later": later, "digest": digest_of(kept)},
        )

    swept = blob_upkeep.sweep(db, stored_settings, later, objects=objects)

    assert swept.blobs == [digest_of(expired)]
    assert in_store(objects, digest_of(expired)) is None
    assert in_store(objects, digest_of(left_behind)) is None
    assert in_store(objects, digest_of(kept)) == kept


def test_the_apps_sweeper_removes_copies_without_a_row(
    stored_settings: Settings, db: Engine, objects: ObjectStore
) -> None:
    stray = b"no row names me"
    objects.put_bytes(blob_key(digest_of(stray)), stray)
    settings = stored_settings.model_copy(update={"blob_sweep_interval_s": 0.05})
    with TestClient(create_app(settings, db)):
        wait_for(
            lambda: in_store(objects, digest_of(stray)) is None,
            10,
            "the sweeper to remove a copy whose blob has no row",
        )


def test_a_store_that_is_down_fails_no_upload_nor_delete(
    api: TestClient,
    db: Engine,
    stored_settings: Settings,
    s3: S3Server,
    objects: ObjectStore,
    caplog: pytest.LogCaptureFixture,
) -> None:
    data = b"uploaded while the store is down"
    digest = digest_of(data)
    s3.stop()
    r = api.put(f"{API}/{digest}", content=data)
    assert r.status_code == 201 and r.json()["size"] == len(data)
    assert BlobStore.from_settings(stored_settings).path(digest).read_bytes() == data
    assert f"blob {digest} was not copied to" in caplog.text
    s3.start()
    assert in_store(objects, digest) is None  # workers fetch it through the API

    assert api.put(f"{API}/{digest}", content=data).status_code == 200
    assert in_store(objects, digest) == data  # the next PUT copies it
    s3.stop()
    assert api.delete(f"{API}/{digest}").status_code == 204
    assert "copies stay in" in caplog.text
    s3.start()
    assert in_store(objects, digest) == data  # left behind: the sweep removes it
    blob_upkeep.sweep(db, stored_settings, objects=objects)
    assert in_store(objects, digest) is None
