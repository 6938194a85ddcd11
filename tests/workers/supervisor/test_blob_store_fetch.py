"""A worker on another box fetches blobs from the object store (the real moto server)
when it has them, and from the API (a real uvicorn) when the store lacks a blob, holds
other bytes under its key, or is down."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from service.app import create_app
from service.migrate import upgrade
from service.objects.layout import blob_key
from service.settings import Settings
from tests.object_store import S3Server
from tests.stack import free_port
from tests.stack import serving as serving_app
from workers.supervisor.blob_cache import BlobCache

TOKEN = "a-test-token-of-enough-length"


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@contextmanager
def serving(tmp_path: Path, storage_url: str | None = None) -> Iterator[str]:
    """A real API (uvicorn, in a thread) on a free loopback port, its own disk and
    database; its URL."""
    url = f"sqlite:///{tmp_path / 'api.db'}"
    upgrade(url)
    settings = Settings(
        database_url=url,
        data_dir=tmp_path / "api",
        api_token=TOKEN,
        allowed_hosts=["127.0.0.1"],
        storage_url=storage_url,
    )
    with serving_app(create_app(settings)) as api_url:
        yield api_url


def upload(api_url: str, data: bytes) -> str:
    digest = digest_of(data)
    r = httpx.put(
        f"{api_url}/api/v1/blobs/{digest}",
        content=data,
        headers={"Authorization": f"Bearer {TOKEN}"},
    )
    assert r.status_code == 201, r.text
    return digest


def worker_cache(tmp_path: Path, api_url: str, s3: S3Server) -> BlobCache:
    """A worker's cache on another box: no blob store on its disk."""
    settings = Settings(data_dir=tmp_path / "box", api_url=api_url, api_token=TOKEN)
    return BlobCache(settings, objects=s3.store())


def test_a_blob_the_api_copied_is_fetched_from_the_store_with_the_api_gone(
    tmp_path: Path, s3: S3Server
) -> None:
    data = b"a data file" * 1000
    with serving(tmp_path, s3.url) as api_url:
        digest = upload(api_url, data)
    nowhere = f"http://127.0.0.1:{free_port()}"  # nothing listens: only the store can serve
    path = worker_cache(tmp_path, nowhere, s3).blob(digest)
    assert path == tmp_path / "box" / "cache" / "blobs" / digest.removeprefix("sha256:")
    assert path.read_bytes() == data
    assert not (path.stat().st_mode & 0o222)  # read-only, as the API's fetches are
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temp file left


def test_other_bytes_under_the_key_are_passed_over_for_the_api(
    tmp_path: Path, s3: S3Server, caplog: pytest.LogCaptureFixture
) -> None:
    data = b"the real bytes"
    with serving(tmp_path) as api_url:
        digest = upload(api_url, data)
        s3.store().put_bytes(blob_key(digest), b"other bytes!!!")  # the same size, even
        path = worker_cache(tmp_path, api_url, s3).blob(digest)
    assert path.read_bytes() == data
    assert [p.name for p in path.parent.iterdir()] == [path.name]
    assert f"blob {digest} in ObjectStore({s3.url}) holds other bytes" in caplog.text


def test_a_blob_the_store_lacks_is_fetched_from_the_api(
    tmp_path: Path, s3: S3Server, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="workers.supervisor.blob_cache")
    data = b"uploaded before the store was set up"
    with serving(tmp_path) as api_url:
        digest = upload(api_url, data)
        assert worker_cache(tmp_path, api_url, s3).blob(digest).read_bytes() == data
    assert f"blob {digest} is not in" in caplog.text


def test_a_store_that_is_down_leaves_the_fetch_to_the_api(
    tmp_path: Path, s3: S3Server, caplog: pytest.LogCaptureFixture
) -> None:
    data = b"fetched while the store is down"
    with serving(tmp_path, s3.url) as api_url:
        digest = upload(api_url, data)
        cache = worker_cache(tmp_path, api_url, s3)
        s3.stop()
        assert cache.blob(digest).read_bytes() == data
    assert f"blob {digest} not fetched from" in caplog.text
