"""Blobs: uploads streamed to disk and kept only whole and matching, their rows, the
jobs that use them, and the sweep; on a real SQLite file and on PostgreSQL."""

from __future__ import annotations

import errno
import hashlib
import os
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, update
from starlette.requests import ClientDisconnect

from service import blob_rows, blob_upkeep, blobs, store
from service.app import create_app
from service.blobs import BlobStore
from service.db import read_session, write_session
from service.errors import BlobNotFound, BlobStorageFull, BlobTooLarge
from service.models import Job, JobCreate, JobStatus, utcnow
from service.settings import Settings
from tests.stack import wait_for

LIMIT = 1_500_000  # TRAINYARD_MAX_BLOB_BYTES in these tests: past the JSON body limit
API = "/api/v1/blobs"


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def stored(blob_store: BlobStore) -> list[str]:
    return sorted(
        str(p.relative_to(blob_store.root)) for p in blob_store.root.rglob("*") if p.is_file()
    )


@pytest.fixture
def blob_settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"max_blob_bytes": LIMIT})


@pytest.fixture
def api(blob_settings: Settings, db: Engine) -> Iterator[TestClient]:
    with TestClient(create_app(blob_settings, db)) as client:
        yield client


@pytest.fixture
def blob_store(blob_settings: Settings) -> BlobStore:
    return BlobStore.from_settings(blob_settings)


def counting(data: bytes, chunk: int, sent: list[int]) -> Iterator[bytes]:
    """The body as chunks (no Content-Length: sent chunked), counting what was taken."""
    for i in range(0, len(data), chunk):
        sent.append(1)
        yield data[i : i + chunk]


def new_job(engine: Engine) -> int:
    job, _ = store.create_job(engine, JobCreate(recipe="r"))
    assert job.id is not None
    return job.id


def finish(engine: Engine, job_id: int, at: Any = None) -> None:
    with write_session(engine) as session:
        session.exec(
            update(Job)
            .where(Job.id == job_id)  # type: ignore[arg-type]
            .values(status=JobStatus.succeeded, finished_at=at or utcnow())
        )


def attach(engine: Engine, job_id: int, **uses: str) -> None:
    with write_session(engine) as session:
        blob_rows.attach(session, job_id, uses)


def test_upload_then_head_metadata_and_download(api: TestClient, blob_store: BlobStore) -> None:
    data = os.urandom(300_000)
    digest = digest_of(data)
    assert api.head(f"{API}/{digest}").status_code == 404
    r = api.put(f"{API}/{digest}", content=data)
    assert r.status_code == 201, r.text
    assert r.headers["location"] == f"{API}/{digest}"
    assert r.json()["digest"] == digest and r.json()["size"] == len(data)
    head = api.head(f"{API}/{digest}")
    assert head.status_code == 200 and head.headers["x-blob-size"] == str(len(data))
    meta = api.get(f"{API}/{digest}").json()
    assert meta["size"] == len(data) and meta["created_at"] and meta["jobs"] == []
    assert meta["last_used_at"] is None
    assert api.get(f"{API}/{digest}/content").content == data
    assert blob_store.path(digest).read_bytes() == data
    assert stored(blob_store) == [f"sha256/{digest[7:]}"]  # no temp file left
    again = api.put(f"{API}/{digest}", content=data)
    assert again.status_code == 200 and again.json()["size"] == len(data)
    assert stored(blob_store) == [f"sha256/{digest[7:]}"]  # one copy
    listing = api.get(API).json()
    assert listing["total"] == 1 and [b["digest"] for b in listing["items"]] == [digest]


def test_list_is_newest_first_and_paged(api: TestClient) -> None:
    digests = []
    for i in range(3):
        data = f"blob {i}".encode()
        digests.append(digest_of(data))
        assert api.put(f"{API}/{digests[-1]}", content=data).status_code == 201
    page = api.get(API, params={"limit": 2}).json()
    assert page["total"] == 3 and [b["digest"] for b in page["items"]] == digests[:0:-1]
    rest = api.get(API, params={"limit": 2, "offset": 2}).json()
    assert [b["digest"] for b in rest["items"]] == [digests[0]]


def test_wrong_digest_is_400_and_nothing_is_left(api: TestClient, blob_store: BlobStore) -> None:
    data = os.urandom(10_000)
    claimed = digest_of(b"something else")
    r = api.put(f"{API}/{claimed}", content=data)
    assert r.status_code == 400
    assert digest_of(data) in r.json()["detail"] and "nothing was stored" in r.json()["detail"]
    assert stored(blob_store) == []
    assert api.head(f"{API}/{claimed}").status_code == 404


def test_over_the_limit_with_content_length_is_refused_before_reading(
    api: TestClient, blob_store: BlobStore
) -> None:
    data = b"x" * (LIMIT + 1)
    sent: list[int] = []
    r = api.put(
        f"{API}/{digest_of(data)}",
        content=counting(data, 65536, sent),
        headers={"content-length": str(len(data))},
    )
    assert r.status_code == 413
    assert str(LIMIT) in r.json()["detail"] and "TRAINYARD_MAX_BLOB_BYTES" in r.json()["detail"]
    assert sent == []  # not one chunk of the body was asked for
    assert stored(blob_store) == []


def test_over_the_limit_without_content_length_is_counted(
    api: TestClient, blob_store: BlobStore
) -> None:
    data = b"y" * (2 * LIMIT)
    sent: list[int] = []
    r = api.put(f"{API}/{digest_of(data)}", content=counting(data, 65536, sent))
    assert r.status_code == 413
    assert str(LIMIT) in r.json()["detail"] and "TRAINYARD_MAX_BLOB_BYTES" in r.json()["detail"]
    assert stored(blob_store) == []


def test_exactly_the_limit_is_accepted(api: TestClient) -> None:
    data = os.urandom(LIMIT)  # past the 1 MB JSON body limit too, which does not apply here
    r = api.put(f"{API}/{digest_of(data)}", content=data)
    assert r.status_code == 201, r.text


def test_the_json_body_limit_still_applies_elsewhere(api: TestClient) -> None:
    big = b"{" + b" " * 1_100_000 + b"}"
    r = api.post("/api/v1/jobs", content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413


def test_a_full_disk_is_507_and_nothing_is_left(
    api: TestClient, blob_store: BlobStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A stand-in: a real full disk cannot be made safely on a shared machine.
    def full(_fd: int, _chunks: list[bytes]) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(blobs, "_write_all", full)
    data = os.urandom(LIMIT)
    r = api.put(f"{API}/{digest_of(data)}", content=data)
    assert r.status_code == 507 and "no space left" in r.json()["detail"]
    assert stored(blob_store) == []


def test_a_disk_that_fills_mid_upload_leaves_nothing(
    blob_store: BlobStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second batch fails while the third arrives: the error surfaces, the writer
    thread is waited for, and the temp file goes."""
    real, calls = blobs._write_all, []

    def fills(fd: int, chunks: list[bytes]) -> None:
        calls.append(1)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(fd, chunks)

    monkeypatch.setattr(blobs, "_write_all", fills)
    data = os.urandom(4 * blobs.BATCH_BYTES)

    async def body() -> Any:
        for i in range(0, len(data), 2**18):
            yield data[i : i + 2**18]

    with pytest.raises(BlobStorageFull):
        anyio.run(blob_store.receive, body(), digest_of(data), 2 * len(data))
    assert len(calls) == 2 and stored(blob_store) == []


def test_a_client_that_goes_away_leaves_nothing(blob_store: BlobStore) -> None:
    async def disconnecting() -> Any:
        yield b"a" * 1000
        raise ClientDisconnect()

    with pytest.raises(ClientDisconnect):
        anyio.run(blob_store.receive, disconnecting(), digest_of(b"a" * 2000), LIMIT)
    assert stored(blob_store) == []


def test_a_cancelled_upload_leaves_nothing(blob_store: BlobStore) -> None:
    async def cancelled() -> None:
        with anyio.CancelScope() as scope:

            async def chunks() -> Any:
                yield b"b" * (blobs.BATCH_BYTES + 1)  # one batch written to the temp file
                scope.cancel()
                await anyio.sleep_forever()

            await blob_store.receive(chunks(), digest_of(b"b"), 10 * blobs.BATCH_BYTES)
        assert scope.cancelled_caught

    anyio.run(cancelled)
    assert stored(blob_store) == []


def test_receive_counts_bytes_not_declarations(blob_store: BlobStore) -> None:
    async def body() -> Any:
        for _ in range(5):
            yield b"c" * 300

    with pytest.raises(BlobTooLarge, match="1000 bytes"):
        anyio.run(blob_store.receive, body(), digest_of(b"c" * 1500), 1000)
    assert stored(blob_store) == []


@pytest.mark.parametrize(
    "bad",
    [
        "sha256:" + "A" * 64,
        "sha256:" + "0" * 63,
        "sha256:" + "0" * 65,
        "md5:" + "0" * 32,
        "0" * 64,
        "sha256:" + "g" * 64,
    ],
)
def test_a_malformed_digest_is_422(api: TestClient, bad: str) -> None:
    assert api.put(f"{API}/{bad}", content=b"x").status_code == 422
    assert api.head(f"{API}/{bad}").status_code == 422
    assert api.get(f"{API}/{bad}").status_code == 422
    assert api.delete(f"{API}/{bad}").status_code == 422


def test_no_token_is_401_before_any_byte_is_read(blob_settings: Settings, db: Engine) -> None:
    settings = blob_settings.model_copy(update={"api_token": "s3cret"})
    blob_store = BlobStore.from_settings(settings)
    data = os.urandom(100_000)
    with TestClient(create_app(settings, db)) as client:
        sent: list[int] = []
        r = client.put(f"{API}/{digest_of(data)}", content=counting(data, 4096, sent))
        assert r.status_code == 401 and sent == []
        assert not blob_store.root.exists() or stored(blob_store) == []
        ok = client.put(
            f"{API}/{digest_of(data)}", content=data, headers={"Authorization": "Bearer s3cret"}
        )
        assert ok.status_code == 201


def test_delete_is_409_while_an_unfinished_job_uses_it(
    api: TestClient, db: Engine, blob_store: BlobStore
) -> None:
    data = b"print('hello')"
    digest = digest_of(data)
    assert api.put(f"{API}/{digest}", content=data).status_code == 201
    job_id = new_job(db)
    attach(db, job_id, code=digest)
    meta = api.get(f"{API}/{digest}").json()
    assert meta["jobs"] == [{"job_id": job_id, "role": "code", "status": "queued"}]
    assert meta["last_used_at"] is not None
    r = api.delete(f"{API}/{digest}")
    assert r.status_code == 409 and str(job_id) in r.json()["detail"]
    assert blob_store.path(digest).exists()
    finish(db, job_id)
    assert api.delete(f"{API}/{digest}").status_code == 204
    assert not blob_store.path(digest).exists()
    assert api.head(f"{API}/{digest}").status_code == 404
    assert api.get(f"{API}/{digest}").status_code == 404
    assert api.delete(f"{API}/{digest}").status_code == 404
    with read_session(db) as session:  # the record of what the job ran with stays
        assert session.get(blob_rows.JobBlob, (job_id, digest, "code")) is not None


def test_attach_refuses_a_blob_that_is_not_stored(db: Engine) -> None:
    job_id = new_job(db)
    missing = digest_of(b"never uploaded")
    with pytest.raises(BlobNotFound, match=missing), write_session(db) as session:
        blob_rows.attach(session, job_id, {"data:x.npz": missing})
    with read_session(db) as session:
        assert blob_rows.unfinished_users(session, missing) == []


def test_unfinished_users_are_queued_running_or_cancelling(db: Engine) -> None:
    digest = plant(db, BlobStore(Path("/nonexistent")), b"d", on_disk=False)
    queued, done = new_job(db), new_job(db)
    attach(db, queued, **{"data:a": digest, "data:b": digest})
    attach(db, done, code=digest)
    finish(db, done)
    with read_session(db) as session:
        assert blob_rows.unfinished_users(session, digest) == [queued]


def plant(
    engine: Engine, blob_store: BlobStore, data: bytes, age_days: float = 0, on_disk: bool = True
) -> str:
    """A stored blob made ``age_days`` ago (file and row), as if uploaded then."""
    digest = digest_of(data)
    created = utcnow() - timedelta(days=age_days)
    if on_disk:
        blob_store.files.mkdir(parents=True, exist_ok=True)
        blob_store.path(digest).write_bytes(data)
        os.utime(blob_store.path(digest), (created.timestamp(), created.timestamp()))
    with write_session(engine) as session:
        blob_rows.record(session, digest, len(data), now=created)
    return digest


def test_sweep_removes_only_unused_expired_blobs(
    db: Engine, blob_settings: Settings, blob_store: BlobStore
) -> None:
    ttl = timedelta(seconds=blob_settings.blob_ttl_s)
    unused_old = plant(db, blob_store, b"unused, old", age_days=8)
    fresh = plant(db, blob_store, b"unused, new", age_days=1)
    queued_old = plant(db, blob_store, b"queued job, old", age_days=30)
    finished_long_ago = plant(db, blob_store, b"finished long ago", age_days=30)
    finished_lately = plant(db, blob_store, b"finished lately", age_days=30)
    attach(db, new_job(db), code=queued_old)
    for digest, finished in ((finished_long_ago, ttl * 2), (finished_lately, ttl / 2)):
        job_id = new_job(db)
        attach(db, job_id, code=digest)
        finish(db, job_id, at=utcnow() - finished)
    # attach marked them used now: age the marks as if the jobs were submitted long ago
    used = [queued_old, finished_long_ago, finished_lately]
    with write_session(db) as session:
        session.exec(
            update(blob_rows.Blob)
            .where(blob_rows.Blob.digest.in_(used))  # type: ignore[attr-defined]
            .values(last_used_at=utcnow() - ttl * 3)
        )
    orphan = digest_of(b"a file whose row never came")
    blob_store.path(orphan).write_bytes(b"a file whose row never came")
    os.utime(blob_store.path(orphan), (0, 0))
    blob_store.tmp.mkdir(parents=True, exist_ok=True)
    (blob_store.tmp / "stale.part").write_bytes(b"killed mid-upload")
    os.utime(blob_store.tmp / "stale.part", (0, 0))
    (blob_store.tmp / "live.part").write_bytes(b"an upload in progress")

    swept = blob_upkeep.sweep(db, blob_settings)

    assert sorted(swept.blobs) == sorted([unused_old, finished_long_ago])
    assert swept.orphans == [orphan] and swept.temps == 1
    left = {queued_old, fresh, finished_lately}
    assert {f"sha256:{p.name}" for p in blob_store.files.iterdir()} == left
    assert [p.name for p in blob_store.tmp.iterdir()] == ["live.part"]
    with read_session(db) as session:
        assert blob_rows.known(session, [unused_old, orphan, *left]) == left
    assert blob_upkeep.sweep(db, blob_settings) == blob_upkeep.Swept([], [], 0)  # none due


def test_the_app_sweeps_periodically(
    blob_settings: Settings, db: Engine, blob_store: BlobStore
) -> None:
    settings = blob_settings.model_copy(update={"blob_sweep_interval_s": 0.05})
    digest = plant(db, blob_store, b"unused for a month", age_days=30)
    with TestClient(create_app(settings, db)) as client:
        wait_for(
            lambda: client.head(f"{API}/{digest}").status_code == 404,
            10,
            "the sweeper to remove an expired blob",
        )
    assert not blob_store.path(digest).exists()


def test_swagger_offers_a_binary_body(api: TestClient) -> None:
    put = api.get("/openapi.json").json()["paths"][f"{API}/{{digest}}"]["put"]
    schema = put["requestBody"]["content"]["application/octet-stream"]["schema"]
    assert schema == {"type": "string", "format": "binary"}
