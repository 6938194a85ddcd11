"""Hostile input: /metrics must not grow with what strangers send.

Its route label comes from the matched route's template only; every path no route
matches shares one label; so thousands of distinct requests (with a token or without)
add no series."""

from __future__ import annotations

import re
from pathlib import Path

from fastapi.testclient import TestClient

from service.app import create_app
from service.migrate import upgrade
from service.settings import Settings

TOKEN = "metrics-test-token"


def series(text: str) -> set[tuple[str, str, str]]:
    """(method, route, status) of every request counter in a /metrics page."""
    found = re.findall(
        r'^trainyard_http_requests_total\{method="([^"]*)",route="([^"]*)",status="([^"]*)"\}',
        text,
        re.MULTILINE,
    )
    return {s for s in found if s[1] != "/metrics"}  # the scrapes themselves


def test_distinct_hostile_paths_add_no_series(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'trainyard.db'}"
    upgrade(url)
    settings = Settings(
        database_url=url,
        data_dir=tmp_path / "data",
        api_token=TOKEN,
        allowed_hosts=["testserver"],
        metrics_open=True,  # scraped below without the token
    )
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with TestClient(create_app(settings)) as client:

        def barrage(start: int, n: int) -> None:
            for i in range(start, start + n):
                client.get(f"/api/v1/jobs/X{i}/artifacts/q/X{i}")  # 401, no token
                client.get(f"/api/v1/jobs/{i}/artifacts/evil{i}", headers=auth)  # 404
                client.get(f"/api/v1/blobs/sha256:{i:064x}", headers=auth)
                client.get(f"/no/such/page/{i}")

        barrage(0, 200)
        first = series(client.get("/metrics").text)
        barrage(200, 200)
        second = series(client.get("/metrics").text)
    assert second == first  # 800 more distinct requests: not one more series
    routes = {route for _, route, _ in second}
    assert routes == {
        "/api/v1/jobs/{job_id}/artifacts/{name:path}",
        "/api/v1/blobs/{digest}",
        "unmatched",
    }, routes


def test_made_up_methods_share_one_label(tmp_path: Path) -> None:
    """The method label is the method only when it is a standard one: 50 made-up methods
    (an h11 server passes any token through) add at most the one "other" series per
    route and status, never one each."""
    url = f"sqlite:///{tmp_path / 'trainyard.db'}"
    upgrade(url)
    settings = Settings(
        database_url=url,
        data_dir=tmp_path / "data",
        api_token=TOKEN,
        allowed_hosts=["testserver"],
        metrics_open=True,
    )
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with TestClient(create_app(settings)) as client:
        client.request("FOO0", "/api/v1/jobs", headers=auth)
        client.request("FOO0", "/no/such/page")
        first = series(client.get("/metrics").text)
        for i in range(1, 51):
            client.request(f"FOO{i}", "/api/v1/jobs", headers=auth)
            client.request(f"FOO{i}", "/no/such/page")
        second = series(client.get("/metrics").text)
    assert second == first, second - first  # 100 more made-up requests: no new series
    methods = {method for method, _, _ in second}
    assert not any(m.startswith("FOO") for m in methods), methods
    assert "other" in methods, methods
