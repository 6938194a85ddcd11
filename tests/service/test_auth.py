"""Bearer-token auth on /api/v1, and the refusal to serve the network without a token."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from service.app import create_app
from service.settings import Settings

DIGEST = "sha256:" + "0" * 64
TOKEN = "auth-test-token-0123456789"
ROUTES = [
    ("GET", "/api/v1/jobs"),
    ("POST", "/api/v1/jobs"),
    ("GET", "/api/v1/jobs/1"),
    ("POST", "/api/v1/jobs/1/cancel"),
    ("POST", "/api/v1/jobs/1/rerun"),
    ("GET", "/api/v1/jobs/1/metrics"),
    ("GET", "/api/v1/jobs/1/logs"),
    ("GET", "/api/v1/jobs/1/events"),
    ("GET", "/api/v1/jobs/1/artifacts"),
    ("GET", "/api/v1/jobs/1/artifacts/model.safetensors"),
    ("GET", "/api/v1/recipes"),
    ("GET", "/api/v1/workers"),
    ("GET", "/api/v1/blobs"),
    ("PUT", f"/api/v1/blobs/{DIGEST}"),
    ("HEAD", f"/api/v1/blobs/{DIGEST}"),
    ("GET", f"/api/v1/blobs/{DIGEST}"),
    ("DELETE", f"/api/v1/blobs/{DIGEST}"),
    ("GET", f"/api/v1/blobs/{DIGEST}/content"),
    ("GET", "/api/v1/me"),
    ("GET", "/api/v1/users"),
    ("POST", "/api/v1/users"),
    ("PATCH", "/api/v1/users/alice/quotas"),
    ("POST", "/api/v1/users/alice/tokens"),
    ("GET", "/api/v1/users/alice/tokens"),
    ("POST", "/api/v1/tokens/1/revoke"),
    ("GET", "/api/v1/audit"),
    ("GET", "/api/v1/sweeps"),
    ("POST", "/api/v1/sweeps"),
    ("GET", "/api/v1/sweeps/1"),
    ("POST", "/api/v1/sweeps/1/cancel"),
    ("GET", "/api/v1/users/usage"),
    ("GET", "/api/v1/webhooks"),
    ("POST", "/api/v1/webhooks"),
    ("GET", "/api/v1/webhooks/1"),
    ("DELETE", "/api/v1/webhooks/1"),
    ("POST", "/api/v1/webhooks/1/ping"),
]


def test_every_api_route_needs_the_token(settings: Settings, engine: Engine) -> None:
    app = create_app(settings.model_copy(update={"api_token": TOKEN}), engine)
    with TestClient(app) as client:
        api_paths = {
            p for p in client.get("/openapi.json").json()["paths"] if p.startswith("/api/v1")
        }
        assert api_paths == {
            p.replace("/jobs/1", "/jobs/{job_id}")
            .replace("/sweeps/1", "/sweeps/{sweep_id}")
            .replace("/webhooks/1", "/webhooks/{webhook_id}")
            .replace("model.safetensors", "{name}")
            .replace(DIGEST, "{digest}")
            .replace("/users/alice/", "/users/{name}/")
            .replace("/tokens/1/", "/tokens/{token_id}/")
            for _, p in ROUTES
        }
        for method, path in ROUTES:
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
                r = client.request(method, path, headers=headers)
                assert r.status_code == 401, (method, path, headers)
                assert r.headers["www-authenticate"] == "Bearer"
        ok = client.get("/api/v1/jobs", headers={"Authorization": f"Bearer {TOKEN}"})
        assert ok.status_code == 200
        assert client.get("/healthz").json()["status"] == "ok"  # open: probes carry no token


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.5", "::", "example.org"])
def test_refuses_network_bind_without_token(host: str) -> None:
    with pytest.raises(SystemExit, match="TRAINYARD_API_TOKEN"):
        Settings(host=host, api_token=None).require_safe_bind()


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1", "127.0.0.2"])
def test_loopback_needs_no_token(host: str) -> None:
    # require_safe_bind raises SystemExit to refuse; returning (None) is the consent
    assert Settings(host=host, api_token=None).require_safe_bind() is None


def test_network_bind_with_token_is_allowed() -> None:
    assert Settings(host="0.0.0.0", api_token=TOKEN).require_safe_bind() is None
