"""The client's download from a server that redirects to the object store
(TRAINYARD_STORAGE_REDIRECT): it follows the link, never with the API's token, and saves
the file whole or not at all; against a real server and the real moto S3 server."""

from __future__ import annotations

import asyncio
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from service.objects import layout
from service.objects.layout import Manifest, StoredFile
from tests.object_store import S3Server
from tests.stack import Stack, running_stack
from trainyard import AsyncClient, Client, Unavailable

pytestmark = pytest.mark.slow

WEIGHTS = os.urandom(2 * 1024 * 1024 + 5)


class Recording(httpx.HTTPTransport):
    """The real transport, keeping each request as it was sent (its URL and headers)."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[httpx.Request] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.sent.append(request)
        return super().handle_request(request)


class AsyncRecording(httpx.AsyncHTTPTransport):
    def __init__(self) -> None:
        super().__init__()
        self.sent: list[httpx.Request] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.sent.append(request)
        return await super().handle_async_request(request)


@pytest.fixture
def token() -> str:
    return secrets.token_urlsafe(32)


@pytest.fixture
def stack(tmp_path: Path, s3: S3Server, token: str) -> Iterator[Stack]:
    """An API with a token, redirecting downloads of stored artifacts to the store (the
    ``s3`` fixture's AWS_ variables are in the environment its process inherits)."""
    token_file = tmp_path / "token"
    token_file.write_text(token)
    with running_stack(
        tmp_path, storage_url=s3.url, storage_redirect="true", api_token_file=token_file
    ) as s:
        yield s


def stored_job(yard: Client, s3: S3Server) -> int:
    """A job (queued: no worker) whose model only the store holds."""
    job_id = yard.submit(recipe="anything", accelerator="cpu", devices=1).id
    objects = s3.store()
    key = layout.artifact_key(job_id, "model.safetensors")
    objects.put_bytes(key, WEIGHTS)
    manifest = Manifest(
        job_id=job_id, files=[StoredFile(name="model.safetensors", key=key, size=len(WEIGHTS))]
    )
    layout.publish_artifacts(objects, manifest)
    return job_id


def assert_token_went_to_the_api_alone(
    sent: list[httpx.Request], stack: Stack, s3: S3Server
) -> None:
    api, store = sent[-2], sent[-1]
    assert urlsplit(str(api.url)).netloc == urlsplit(stack.url).netloc
    assert api.headers["authorization"].startswith("Bearer ")
    assert urlsplit(str(store.url)).netloc == urlsplit(s3.endpoint).netloc
    assert "Signature=" in str(store.url), "the presigned link, as the API gave it"
    assert "authorization" not in store.headers
    assert not any(v.startswith("Bearer") for v in store.headers.values())


def test_a_download_follows_the_redirect_to_the_store_without_the_token(
    stack: Stack, s3: S3Server, token: str, tmp_path: Path
) -> None:
    recording = Recording()
    with Client(stack.url, token=token, transport=recording) as yard:
        job_id = stored_job(yard, s3)
        assert [a.name for a in yard.artifacts(job_id)] == ["model.safetensors"]
        saved = yard.download(job_id, "model.safetensors", f"{tmp_path}/out/")
    assert saved == tmp_path / "out" / "model.safetensors"
    assert saved.read_bytes() == WEIGHTS
    assert_token_went_to_the_api_alone(recording.sent, stack, s3)

    async def download() -> Path:
        async with AsyncClient(stack.url, token=token, transport=recorded) as yard:
            return await yard.download(job_id, "model.safetensors", tmp_path / "async.bin")

    recorded = AsyncRecording()
    assert asyncio.run(download()).read_bytes() == WEIGHTS
    assert_token_went_to_the_api_alone(recorded.sent, stack, s3)


def test_a_store_down_saves_nothing(stack: Stack, s3: S3Server, token: str, tmp_path: Path) -> None:
    with Client(stack.url, token=token, retries=0) as yard:
        job_id = stored_job(yard, s3)
        s3.stop()
        try:
            with pytest.raises(Unavailable, match="object store is unreachable"):
                yard.download(job_id, "model.safetensors", tmp_path)
        finally:
            s3.start()
    assert list(tmp_path.glob("*model.safetensors*")) == [], "no file, not even a part"
