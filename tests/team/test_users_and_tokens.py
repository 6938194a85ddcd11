"""A box a team shares: users with their own tokens, who may act on which job, the
queued-jobs quota, and the audit trail, through the real API on both databases."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text, update

from service import store
from service.app import create_app
from service.models import ApiToken, utcnow
from service.settings import Settings

ADMIN_TOKEN = "bootstrap-admin-token-0123456789"
SPEC = {"recipe": "mlp-regression", "devices": 1, "accelerator": "cpu"}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


ADMIN = bearer(ADMIN_TOKEN)


@pytest.fixture
def api(settings: Settings, engine: Engine, add_worker: Any) -> Iterator[TestClient]:
    """A server with a bootstrap admin token (a shared box), and a CPU worker."""
    add_worker("box")
    guarded = settings.model_copy(update={"api_token": ADMIN_TOKEN})
    with TestClient(create_app(guarded, engine)) as client:
        yield client


def add_user(api: TestClient, name: str, admin: bool = False) -> str:
    """A new user and a token of theirs (made by the admin): the token."""
    r = api.post("/api/v1/users", json={"name": name, "admin": admin}, headers=ADMIN)
    assert r.status_code == 201, r.text
    r = api.post(f"/api/v1/users/{name}/tokens", headers=ADMIN)
    assert r.status_code == 201, r.text
    token: str = r.json()["token"]
    return token


def submit(api: TestClient, token: str) -> dict[str, Any]:
    r = api.post("/api/v1/jobs", json=SPEC, headers=bearer(token))
    assert r.status_code == 201, r.text
    job: dict[str, Any] = r.json()
    return job


def test_each_user_acts_on_their_own_jobs_and_an_admin_on_all(api: TestClient) -> None:
    alice, bob = add_user(api, "alice"), add_user(api, "bob")
    job = submit(api, alice)
    assert job["owner"] == "alice"
    # bob sees it (a shared box is transparent) but may not cancel or rerun it
    assert api.get(f"/api/v1/jobs/{job['id']}", headers=bearer(bob)).json()["owner"] == "alice"
    for action in ("cancel", "rerun"):
        r = api.post(f"/api/v1/jobs/{job['id']}/{action}", headers=bearer(bob))
        assert r.status_code == 403, r.text
        assert (
            r.json()["detail"] == f"job {job['id']} is alice's: only alice or an admin may do that"
        )
    # alice reruns her own: the new job is hers; an admin cancels any
    rerun = api.post(f"/api/v1/jobs/{job['id']}/rerun", headers=bearer(alice))
    assert rerun.status_code == 201 and rerun.json()["owner"] == "alice"
    r = api.post(f"/api/v1/jobs/{job['id']}/cancel", headers=ADMIN)
    assert r.status_code == 202 and r.json()["status"] == "cancelled"
    bobs = submit(api, bob)
    mine = api.get("/api/v1/jobs", params={"owner": "me"}, headers=bearer(bob)).json()
    assert [j["id"] for j in mine["items"]] == [bobs["id"]] and mine["total"] == 1
    everyone = api.get("/api/v1/jobs", headers=bearer(bob)).json()
    assert {j["owner"] for j in everyone["items"]} == {"alice", "bob"}
    assert api.get("/api/v1/me", headers=bearer(bob)).json() == {"name": "bob", "admin": False}


def test_tokens_are_stored_hashed_and_shown_once(api: TestClient, engine: Engine) -> None:
    token = add_user(api, "carol")
    assert token.startswith("ty_") and len(token) > 40
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT * FROM api_token")).mappings().all()
    stored = " ".join(str(v) for row in rows for v in row.values())
    assert token not in stored and token[10:] not in stored  # nothing past the prefix
    assert [r["token_hash"] for r in rows] == [hashlib.sha256(token.encode()).hexdigest()]
    listed = api.get("/api/v1/users/carol/tokens", headers=bearer(token)).json()
    assert [t["prefix"] for t in listed] == [token[:9]] and "token" not in listed[0]


def test_a_revoked_token_is_refused_at_once(api: TestClient) -> None:
    token = add_user(api, "dave")
    assert api.get("/api/v1/me", headers=bearer(token)).status_code == 200  # now cached
    (listed,) = api.get("/api/v1/users/dave/tokens", headers=bearer(token)).json()
    r = api.post(f"/api/v1/tokens/{listed['id']}/revoke", headers=bearer(token))
    assert r.status_code == 200 and r.json()["revoked_at"] is not None
    r = api.get("/api/v1/me", headers=bearer(token))
    assert r.status_code == 401 and "revoked" in r.json()["detail"]
    assert api.post("/api/v1/jobs", json=SPEC, headers=bearer(token)).status_code == 401


def test_an_expired_token_is_refused(api: TestClient, engine: Engine) -> None:
    token = add_user(api, "erin")
    with engine.begin() as conn:
        conn.execute(update(ApiToken).values(expires_at=utcnow() - timedelta(seconds=1)))
    assert api.get("/api/v1/me", headers=bearer(token)).status_code == 401
    r = api.post("/api/v1/users/erin/tokens", json={"expires_in_days": 90}, headers=ADMIN)
    assert r.status_code == 201
    days = (r.json()["expires_at"] and r.json()["expires_at"][:10]) or ""
    assert days == (utcnow() + timedelta(days=90)).date().isoformat()
    assert api.get("/api/v1/me", headers=bearer(r.json()["token"])).status_code == 200


def test_no_token_or_a_made_up_one_is_refused(api: TestClient) -> None:
    assert api.get("/api/v1/jobs").status_code == 401
    assert api.get("/api/v1/me", headers=bearer("ty_made-up-token-of-nobody")).status_code == 401
    assert api.get("/api/v1/me", headers=ADMIN).json() == {"name": "admin", "admin": True}


def test_only_admins_manage_users_and_read_the_audit_trail(api: TestClient) -> None:
    frank = add_user(api, "frank")
    r = api.post("/api/v1/users", json={"name": "mallory"}, headers=bearer(frank))
    assert r.status_code == 403 and "only an admin may add users" in r.json()["detail"]
    assert api.post("/api/v1/users/admin/tokens", headers=bearer(frank)).status_code == 403
    assert api.get("/api/v1/audit", headers=bearer(frank)).status_code == 403
    assert api.post("/api/v1/users", json={"name": "frank"}, headers=ADMIN).status_code == 409
    assert api.post("/api/v1/users", json={"name": "Bad Name"}, headers=ADMIN).status_code == 422


def test_the_audit_trail_says_who_did_what(api: TestClient) -> None:
    gina = add_user(api, "gina")
    job = submit(api, gina)
    api.post(f"/api/v1/jobs/{job['id']}/rerun", headers=bearer(gina))
    api.post(f"/api/v1/jobs/{job['id']}/cancel", headers=ADMIN)
    (token,) = api.get("/api/v1/users/gina/tokens", headers=ADMIN).json()
    api.post(f"/api/v1/tokens/{token['id']}/revoke", headers=ADMIN)
    events = api.get("/api/v1/audit", headers=ADMIN).json()["items"]
    seen = [(e["actor"], e["action"], e["target"]) for e in reversed(events)]
    assert seen == [
        ("admin", "user_added", "gina"),
        ("admin", "token_created", "gina"),
        ("gina", "submitted", f"job {job['id']}"),
        ("gina", "submitted", f"job {job['id'] + 1}"),  # the rerun's new job ...
        ("gina", "reran", f"job {job['id']}"),  # ... and what it reran
        ("admin", "cancelled", f"job {job['id']}"),
        ("admin", "token_revoked", "gina"),
    ]
    only = api.get("/api/v1/audit", params={"actor": "gina"}, headers=ADMIN).json()
    assert only["total"] == 3


def test_a_submit_past_the_queued_quota_is_429(api: TestClient) -> None:
    hank = add_user(api, "hank")
    r = api.patch("/api/v1/users/hank/quotas", json={"max_queued_jobs": 2}, headers=ADMIN)
    assert r.status_code == 200 and r.json()["max_queued_jobs"] == 2
    submit(api, hank)
    submit(api, hank)
    r = api.post("/api/v1/jobs", json=SPEC, headers=bearer(hank))
    assert r.status_code == 429, r.text
    assert r.headers["Retry-After"] == "60"
    assert r.json()["detail"].startswith("hank has 2 jobs queued, the most allowed (2, hank's own")
    submit(api, add_user(api, "ivy"))  # another user's queue is not hank's
    r = api.patch("/api/v1/users/hank/quotas", json={"max_queued_jobs": None}, headers=ADMIN)
    assert r.json()["max_queued_jobs"] is None
    submit(api, hank)  # back to the default: no limit


def test_a_server_without_a_token_acts_as_the_admin_unless_a_user_token_is_sent(
    client: TestClient,
) -> None:
    """The loopback default (no TRAINYARD_API_TOKEN): one person's box, as before; a
    user's token still counts as that user, and a revoked one is refused."""
    assert client.get("/api/v1/me").json() == {"name": "admin", "admin": True}
    client.post("/api/v1/users", json={"name": "jo"})
    token = client.post("/api/v1/users/jo/tokens").json()
    assert client.get("/api/v1/me", headers=bearer(token["token"])).json()["name"] == "jo"
    client.post(f"/api/v1/tokens/{token['id']}/revoke")
    assert client.get("/api/v1/me", headers=bearer(token["token"])).status_code == 401


def test_only_an_admin_may_submit_a_job_that_is_never_preempted(api: TestClient) -> None:
    kim = add_user(api, "kim")
    pinned = {**SPEC, "preemptible": False}
    r = api.post("/api/v1/jobs", json=pinned, headers=bearer(kim))
    assert r.status_code == 403 and "preemptible: false" in r.json()["detail"]
    r = api.post("/api/v1/jobs", json=pinned, headers=ADMIN)
    assert r.status_code == 201 and r.json()["preemptible"] is False
    assert (
        api.post("/api/v1/jobs", json={**SPEC, "preemptible": 0}, headers=ADMIN).status_code == 422
    )


def test_a_job_past_its_owners_running_quota_says_so(api: TestClient, engine: Engine) -> None:
    lee = add_user(api, "lee")
    api.patch("/api/v1/users/lee/quotas", json={"max_running_devices": 1}, headers=ADMIN)
    first, second = submit(api, lee), submit(api, lee)
    claim = {"worker_id": "box", "free_devices": 2, "accelerator": "cpu", "lease_s": 30}
    claimed = store.claim_job(engine, recipes=["mlp-regression"], **claim)
    assert claimed is not None and claimed.fence.job_id == first["id"]
    assert store.claim_job(engine, recipes=["mlp-regression"], **claim) is None
    waiting = api.get(f"/api/v1/jobs/{second['id']}", headers=bearer(lee)).json()
    assert waiting["reason"]["code"] == "quota", waiting["reason"]
    assert "lee's jobs hold 1 of their 1 devices (quota)" in waiting["reason"]["message"]
