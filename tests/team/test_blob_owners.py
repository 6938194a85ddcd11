"""Blobs on a shared box: each user sees the blobs they uploaded or their jobs use, deletes
only their own upload (an admin any blob), and every delete is audited; a digest alone
gets no one someone else's data. Through the real API, on both databases."""

from __future__ import annotations

import hashlib
import io
import zipfile
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text

from service import blob_rows
from service.app import create_app
from service.db import write_session
from service.settings import Settings
from tests.team.test_users_and_tokens import ADMIN, ADMIN_TOKEN, add_user, bearer

BLOBS = "/api/v1/blobs"


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def package() -> bytes:
    """A code package: a script that does nothing."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        zf.writestr("train.py", "print('hello')\n")
    return buffer.getvalue()


@pytest.fixture
def api(settings: Settings, engine: Engine, add_worker: Any) -> Iterator[TestClient]:
    """A shared box (a bootstrap admin token), a CPU worker, and no blob rows left by a
    test before (the PostgreSQL database is the run's)."""
    with engine.begin() as conn:
        for table in ("job_blob", "blob_upload", "blob"):
            conn.execute(text(f"DELETE FROM {table}"))
    add_worker("box")
    guarded = settings.model_copy(update={"api_token": ADMIN_TOKEN})
    with TestClient(create_app(guarded, engine)) as client:
        yield client


def put(api: TestClient, token: str, data: bytes) -> int:
    r = api.put(f"{BLOBS}/{digest_of(data)}", content=data, headers=bearer(token))
    assert r.status_code in (200, 201), r.text
    return r.status_code


def sees(api: TestClient, token: str, digest: str) -> dict[str, int]:
    """What each way of looking at a blob answers ``token``'s user."""
    auth = bearer(token)
    listing = api.get(BLOBS, headers=auth).json()
    return {
        "listed": [b["digest"] for b in listing["items"]].count(digest),
        "head": api.head(f"{BLOBS}/{digest}", headers=auth).status_code,
        "get": api.get(f"{BLOBS}/{digest}", headers=auth).status_code,
        "content": api.get(f"{BLOBS}/{digest}/content", headers=auth).status_code,
    }


SEEN = {"listed": 1, "head": 200, "get": 200, "content": 200}
UNSEEN = {"listed": 0, "head": 404, "get": 404, "content": 404}


def script_job(code: str, data: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "code": code,
        "entrypoint": ["python", "train.py"],
        "accelerator": "cpu",
    }
    if data is not None:
        spec["data"] = {"train": data}
    return spec


def audited(api: TestClient, action: str) -> list[dict[str, Any]]:
    events = api.get("/api/v1/audit", params={"limit": 100}, headers=ADMIN).json()["items"]
    return [e for e in events if e["action"] == action]


def test_a_user_sees_and_deletes_only_their_own_blobs(api: TestClient) -> None:
    """bob listed, downloaded and deleted alice's data (204), which broke her rerun."""
    alice, bob = add_user(api, "alice"), add_user(api, "bob")
    data = b"alice's private data\n" * 100
    digest = digest_of(data)
    assert put(api, alice, data) == 201
    assert sees(api, alice, digest) == SEEN
    assert sees(api, bob, digest) == UNSEEN  # not even that it exists
    assert sees(api, ADMIN_TOKEN, digest) == SEEN
    r = api.delete(f"{BLOBS}/{digest}", headers=bearer(bob))
    assert r.status_code == 404, r.text
    assert api.get(f"{BLOBS}/{digest}/content", headers=bearer(alice)).content == data
    assert audited(api, "blob_deleted") == []
    # alice deletes her own: gone, and audited
    assert api.delete(f"{BLOBS}/{digest}", headers=bearer(alice)).status_code == 204
    assert sees(api, ADMIN_TOKEN, digest) == UNSEEN
    [event] = audited(api, "blob_deleted")
    assert (event["actor"], event["target"]) == ("alice", f"blob {digest}")
    assert event["detail"] == {"bytes_removed": True, "uploaders": ["alice"]}


def test_a_digest_alone_gets_no_one_the_bytes(api: TestClient) -> None:
    """A PUT of a stored digest was answered without reading the body: anyone who knew a
    digest could have become its uploader. One who has not uploaded it must send it."""
    alice, bob = add_user(api, "alice"), add_user(api, "bob")
    data = b"alice's weights\n" * 100
    digest = digest_of(data)
    put(api, alice, data)
    r = api.put(f"{BLOBS}/{digest}", content=b"", headers=bearer(bob))
    assert r.status_code == 400, r.text  # the empty body does not hash to the digest
    assert sees(api, bob, digest) == UNSEEN
    # sending the bytes proves them: bob is an uploader too, nothing new is stored
    assert put(api, bob, data) == 200
    assert sees(api, bob, digest) == SEEN
    # alice's upload is hers to delete: bob's delete takes only his, and the bytes stay
    assert api.delete(f"{BLOBS}/{digest}", headers=bearer(bob)).status_code == 204
    assert sees(api, bob, digest) == UNSEEN and sees(api, alice, digest) == SEEN
    [event] = audited(api, "blob_deleted")
    assert event["actor"] == "bob" and event["detail"] == {"bytes_removed": False}
    # she already has it: her PUT of it again reads nothing
    assert api.put(f"{BLOBS}/{digest}", content=b"", headers=bearer(alice)).status_code == 200


def test_a_job_may_name_only_blobs_its_owner_may_see(api: TestClient) -> None:
    """A submit naming someone else's blob by its digest is refused as one not stored;
    a job's owner then sees the blobs their job uses, and may not delete them."""
    alice, bob = add_user(api, "alice"), add_user(api, "bob")
    code, data = package(), b"x,y\n1,2\n"
    put(api, alice, code)
    put(api, alice, data)
    spec = script_job(digest_of(code), digest_of(data))
    refused = api.post("/api/v1/jobs", json=spec, headers=bearer(bob))
    assert refused.status_code == 422, refused.text
    [error] = refused.json()["detail"]
    assert error["loc"] == ["body", "code"]
    assert error["msg"] == (
        f"blob {digest_of(code)} is not stored: upload it first with "
        f"PUT /api/v1/blobs/{digest_of(code)}"
    )
    # bob has the code himself, but not alice's data
    put(api, bob, code)
    refused = api.post("/api/v1/jobs", json=spec, headers=bearer(bob))
    assert refused.status_code == 422 and refused.json()["detail"][0]["loc"] == [
        "body",
        "data",
        "train",
    ]
    job = api.post("/api/v1/jobs", json=spec, headers=bearer(alice))
    assert job.status_code == 201, job.text
    # an admin reruns alice's job: an admin may name any blob
    assert api.post(f"/api/v1/jobs/{job.json()['id']}/rerun", headers=ADMIN).status_code == 201
    # used by a job of his own, bob sees the data, but it is not his to delete
    api.post(f"/api/v1/jobs/{job.json()['id']}/cancel", headers=ADMIN)
    mine = api.post("/api/v1/jobs", json=script_job(digest_of(code)), headers=bearer(bob))
    assert mine.status_code == 201, mine.text
    with write_session(api.app.state.engine) as session:  # type: ignore[attr-defined]
        blob_rows.attach(session, mine.json()["id"], {"data:train": digest_of(data)})
    assert sees(api, bob, digest_of(data)) == SEEN
    r = api.delete(f"{BLOBS}/{digest_of(data)}", headers=bearer(bob))
    assert r.status_code == 403 and "not uploaded by you" in r.json()["detail"]


def test_the_last_uploader_keeps_the_rules_for_blobs_in_use(api: TestClient) -> None:
    """Her queued job uses it: alice's delete is refused (409) and nothing is removed."""
    alice = add_user(api, "alice")
    code = package()
    put(api, alice, code)
    job = api.post("/api/v1/jobs", json=script_job(digest_of(code)), headers=bearer(alice))
    assert job.status_code == 201, job.text
    r = api.delete(f"{BLOBS}/{digest_of(code)}", headers=bearer(alice))
    assert r.status_code == 409, r.text
    assert sees(api, alice, digest_of(code)) == SEEN
    assert audited(api, "blob_deleted") == []


def test_a_blob_from_before_uploads_were_recorded_is_an_admins_to_delete(
    api: TestClient,
) -> None:
    alice = add_user(api, "alice")
    data = b"stored long ago\n"
    put(api, ADMIN_TOKEN, data)
    with write_session(api.app.state.engine) as session:  # type: ignore[attr-defined]
        session.execute(text("DELETE FROM blob_upload"))  # as a blob stored before
    assert sees(api, alice, digest_of(data)) == UNSEEN
    assert api.delete(f"{BLOBS}/{digest_of(data)}", headers=bearer(alice)).status_code == 404
    assert api.delete(f"{BLOBS}/{digest_of(data)}", headers=ADMIN).status_code == 204
    [event] = audited(api, "blob_deleted")
    assert event["actor"] == "admin"
    assert event["detail"] == {"bytes_removed": True, "uploaders": []}


def test_seeing_a_blob_through_a_job_is_no_upload_of_it(api: TestClient) -> None:
    """A user whose job uses a blob from before uploads were recorded sees it (and may
    name it in a job again); but a PUT without its bytes does not make them its
    uploader, who could then delete what only an admin may."""
    alice = add_user(api, "alice")
    data = package()
    put(api, alice, data)
    job = api.post("/api/v1/jobs", json=script_job(digest_of(data)), headers=bearer(alice))
    assert job.status_code == 201, job.text
    with write_session(api.app.state.engine) as session:  # type: ignore[attr-defined]
        session.execute(text("DELETE FROM blob_upload"))  # as a blob stored before
    assert sees(api, alice, digest_of(data)) == SEEN  # her job uses it
    empty = api.put(f"{BLOBS}/{digest_of(data)}", content=b"", headers=bearer(alice))
    assert empty.status_code == 400, empty.text  # not her upload: she must send it
    with write_session(api.app.state.engine) as session:  # type: ignore[attr-defined]
        assert blob_rows.uploaders(session, digest_of(data)) == []
    api.post(f"/api/v1/jobs/{job.json()['id']}/cancel", headers=bearer(alice))
    assert api.delete(f"{BLOBS}/{digest_of(data)}", headers=bearer(alice)).status_code in (
        403,
        404,
    )
    put(api, alice, data)  # with the bytes: hers again, to delete
    with write_session(api.app.state.engine) as session:  # type: ignore[attr-defined]
        assert blob_rows.uploaders(session, digest_of(data)) == ["alice"]
