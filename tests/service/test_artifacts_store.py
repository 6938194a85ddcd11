"""A job's artifacts served from the object store (TRAINYARD_STORAGE_URL) beside its local
folder, against the real moto server: listed merged, streamed or redirected to, and an
unreachable store answered for without losing the local files."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from service.app import create_app
from service.objects import layout
from service.objects.layout import Manifest, StoredFile
from service.objects.store import ObjectStore
from service.settings import Settings
from tests.object_store import S3Server

SPEC = {"recipe": "anything", "accelerator": "cpu", "devices": 1, "epochs": 1}
SECRET = b"bytes only the job itself may serve"
BIG = os.urandom(3 * 1024 * 1024 + 17)  # several of a stream's pieces, and a ragged end


@pytest.fixture
def settings(database_url: str, tmp_path: Path, s3: S3Server) -> Settings:
    return Settings(
        database_url=database_url,
        data_dir=tmp_path / "data",
        api_token=None,
        allowed_hosts=["testserver"],
        storage_url=s3.url,
    )


@pytest.fixture
def objects(s3: S3Server) -> ObjectStore:
    """The test's own handle on the store (what a worker would have written with)."""
    return s3.store()


@pytest.fixture
def redirecting(settings: Settings, engine: Engine) -> Iterator[TestClient]:
    """The API with TRAINYARD_STORAGE_REDIRECT on, on the same database and store."""
    changed = settings.model_copy(update={"storage_redirect": True, "storage_link_s": 60})
    with TestClient(create_app(changed, engine)) as c:
        yield c


def new_job(client: TestClient) -> int:
    r = client.post("/api/v1/jobs", json=SPEC)
    assert r.status_code == 201, r.text
    job_id: int = r.json()["id"]
    return job_id


def local(settings: Settings, job_id: int, name: str, data: bytes) -> None:
    path = settings.data_dir / "jobs" / str(job_id) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def publish_final(objects: ObjectStore, job_id: int, files: dict[str, bytes]) -> None:
    """A job's final artifacts, uploaded then named by their manifest, as a worker does."""
    stored = []
    for name, data in files.items():
        key = layout.artifact_key(job_id, name)
        objects.put_bytes(key, data)
        stored.append(StoredFile(name=name, key=key, size=len(data)))
    layout.publish_artifacts(objects, Manifest(job_id=job_id, files=stored))


def publish_checkpoint(objects: ObjectStore, job_id: int, files: dict[str, bytes]) -> None:
    stored = []
    for name, data in files.items():
        key = layout.checkpoint_file_key(job_id, name)
        objects.put_bytes(key, data)
        stored.append(StoredFile(name=name, key=key, size=len(data)))
    layout.publish_checkpoint(objects, Manifest(job_id=job_id, files=stored))


def listed(client: TestClient, job_id: int) -> dict[str, int]:
    r = client.get(f"/api/v1/jobs/{job_id}/artifacts")
    assert r.status_code == 200, r.text
    return {a["name"]: a["size"] for a in r.json()}


def test_the_listing_merges_the_local_folder_the_final_artifacts_and_the_newest_checkpoint(
    client: TestClient, settings: Settings, objects: ObjectStore
) -> None:
    job_id = new_job(client)
    local(settings, job_id, "spec.json", b"{}")
    local(settings, job_id, "model.safetensors", b"this box's weights")
    local(settings, job_id, ".runner/attempt-1.json", b"{}")
    publish_checkpoint(objects, job_id, {"last.pt": b"epoch 1", "epoch-1.pt": b"one"})
    publish_checkpoint(objects, job_id, {"last.pt": b"epoch 2 state", "epoch-2/opt.pt": b"2"})
    publish_final(objects, job_id, {"model.safetensors": b"w" * 40, "output/eval.csv": b"a,b\n"})

    assert listed(client, job_id) == {
        "spec.json": 2,
        "model.safetensors": len(b"this box's weights"),  # the local copy wins
        "output/eval.csv": 4,
        "checkpoints/last.pt": len(b"epoch 2 state"),  # the newest checkpoint's files only
        "checkpoints/epoch-2/opt.pt": 1,
    }
    names = [a["name"] for a in client.get(f"/api/v1/jobs/{job_id}/artifacts").json()]
    assert names == sorted(names)
    got = client.get(f"/api/v1/jobs/{job_id}/artifacts/model.safetensors")
    assert got.content == b"this box's weights"


def test_a_store_only_artifact_streams_through_the_api_as_a_local_one_would(
    client: TestClient, settings: Settings, objects: ObjectStore
) -> None:
    job_id = new_job(client)
    publish_final(objects, job_id, {"output/eval results.csv": b"x,y\n1,2\n"})
    key = layout.artifact_key(job_id, "model.safetensors")
    with open(settings.data_dir.parent / "big", "w+b") as f:  # put_file: a multipart upload
        f.write(BIG)
        f.seek(0)
        objects.put_file(key, f)
    final = layout.stored_artifacts(objects, job_id)
    assert final is not None
    final.files.append(StoredFile(name="model.safetensors", key=key, size=len(BIG)))
    layout.publish_artifacts(objects, final)
    publish_checkpoint(objects, job_id, {"last.pt": b"state"})

    r = client.get(f"/api/v1/jobs/{job_id}/artifacts/model.safetensors")
    assert r.status_code == 200 and r.content == BIG
    assert r.headers["content-length"] == str(len(BIG))
    assert r.headers["content-type"] == "application/octet-stream"
    assert r.headers["content-disposition"] == "attachment; filename*=utf-8''model.safetensors"

    r = client.get(f"/api/v1/jobs/{job_id}/artifacts/checkpoints/last.pt")
    assert r.status_code == 200 and r.content == b"state"

    # The same headers as a local file of that name gets.
    stored = client.get(f"/api/v1/jobs/{job_id}/artifacts/output/eval results.csv")
    local(settings, job_id, "output/eval results.csv", b"x,y\n1,2\n")
    here = client.get(f"/api/v1/jobs/{job_id}/artifacts/output/eval results.csv")
    assert stored.content == here.content == b"x,y\n1,2\n"
    for header in ("content-type", "content-length", "content-disposition"):
        assert stored.headers[header] == here.headers[header], header


def test_redirect_mode_answers_307_to_a_link_the_store_serves_without_the_token(
    redirecting: TestClient, settings: Settings, objects: ObjectStore, s3: S3Server
) -> None:
    job_id = new_job(redirecting)
    publish_final(objects, job_id, {"model.safetensors": BIG})
    local(settings, job_id, "spec.json", b"{}")

    r = redirecting.get(
        f"/api/v1/jobs/{job_id}/artifacts/model.safetensors", follow_redirects=False
    )
    assert r.status_code == 307, r.text
    assert r.headers["cache-control"] == "no-store"
    link = r.headers["location"]
    assert urlsplit(link).netloc == urlsplit(s3.endpoint).netloc
    fetched = httpx.get(link, timeout=30)  # a plain GET: the link carries its credentials
    assert fetched.status_code == 200 and fetched.content == BIG
    assert 'filename="model.safetensors"' in fetched.headers["content-disposition"]

    # A local file is served by the API as before; a browser's request (the dashboard's
    # fetch, its token in a header) is streamed: following it would need the bucket's CORS.
    assert redirecting.get(f"/api/v1/jobs/{job_id}/artifacts/spec.json").content == b"{}"
    r = redirecting.get(
        f"/api/v1/jobs/{job_id}/artifacts/model.safetensors",
        headers={"Sec-Fetch-Site": "same-origin", "Sec-Fetch-Mode": "cors"},
        follow_redirects=False,
    )
    assert r.status_code == 200 and r.content == BIG


def test_a_stopped_store_leaves_the_local_files_and_answers_503_for_its_own(
    client: TestClient, settings: Settings, objects: ObjectStore, s3: S3Server
) -> None:
    job_id, bare = new_job(client), new_job(client)
    local(settings, job_id, "spec.json", b"{}")
    publish_final(objects, job_id, {"model.safetensors": b"weights"})
    publish_final(objects, bare, {"model.safetensors": b"bare weights"})
    assert set(listed(client, job_id)) == {"spec.json", "model.safetensors"}

    s3.stop()
    try:
        assert listed(client, job_id) == {"spec.json": 2}  # this box's files, as they are
        assert client.get(f"/api/v1/jobs/{job_id}/artifacts/spec.json").content == b"{}"
        r = client.get(f"/api/v1/jobs/{job_id}/artifacts/model.safetensors")
        assert r.status_code == 503, r.text
        assert int(r.headers["retry-after"]) > 0
        assert "object store is unreachable" in r.json()["detail"]
        # No local file at all: the listing cannot say what the job has.
        r = client.get(f"/api/v1/jobs/{bare}/artifacts")
        assert r.status_code == 503 and "retry-after" in r.headers
        assert "object store" in r.json()["detail"]
    finally:
        s3.start()

    assert listed(client, bare) == {"model.safetensors": len(b"bare weights")}
    r = client.get(f"/api/v1/jobs/{job_id}/artifacts/model.safetensors")
    assert r.status_code == 200 and r.content == b"weights"


@pytest.mark.parametrize(
    "name",
    [
        "../../secret.txt",
        "..%2F..%2Fsecret.txt",
        "checkpoints/../../2/artifacts/model.safetensors",
        "checkpoints/..%2F..%2Fmodel.safetensors",
        ".hidden",
        "output/.hidden",
        "nope",
    ],
)
def test_names_outside_the_jobs_artifacts_are_refused(
    client: TestClient, settings: Settings, objects: ObjectStore, name: str
) -> None:
    job_id = new_job(client)
    publish_final(objects, job_id, {".hidden": SECRET, "output/.hidden": SECRET})
    publish_final(objects, job_id + 1, {"model.safetensors": SECRET})  # another job's
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    (settings.data_dir / "secret.txt").write_bytes(SECRET)

    assert listed(client, job_id) == {}  # hidden files are left out, as locally
    r = client.get(f"/api/v1/jobs/{job_id}/artifacts/{name}")
    # a client may normalise "../" away, leaving a path that is not a job at all (422)
    assert r.status_code in (404, 422) and SECRET not in r.content, r.text


def test_another_jobs_artifact_is_reachable_from_no_other_job(
    client: TestClient, objects: ObjectStore
) -> None:
    mine, theirs = new_job(client), new_job(client)
    publish_final(objects, theirs, {"model.safetensors": b"their weights"})
    # A manifest edited in the bucket to name another job's object serves nothing.
    forged = StoredFile(
        name="stolen.safetensors",
        key=layout.artifact_key(theirs, "model.safetensors"),
        size=len(b"their weights"),
    )
    layout.publish_artifacts(objects, Manifest(job_id=mine, files=[forged]))

    assert listed(client, mine) == {}
    for name in ("model.safetensors", "stolen.safetensors"):
        r = client.get(f"/api/v1/jobs/{mine}/artifacts/{name}")
        assert r.status_code == 404 and b"their" not in r.content, name
    r = client.get(f"/api/v1/jobs/{theirs}/artifacts/model.safetensors")
    assert r.status_code == 200 and r.content == b"their weights"
    assert client.get("/api/v1/jobs/99999/artifacts/model.safetensors").status_code == 404


def test_the_openapi_document_says_what_the_routes_answer(client: TestClient) -> None:
    paths: dict[str, Any] = client.get("/openapi.json").json()["paths"]
    listing = paths["/api/v1/jobs/{job_id}/artifacts"]["get"]["responses"]
    download = paths["/api/v1/jobs/{job_id}/artifacts/{name}"]["get"]["responses"]
    assert {"200", "404", "502", "503"} <= set(listing)
    assert {"200", "307", "404", "502", "503"} <= set(download)
    assert "Retry-After" in download["503"]["headers"]
    assert "Location" in download["307"]["headers"]
