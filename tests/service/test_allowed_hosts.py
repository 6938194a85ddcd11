"""A wildcard in TRAINYARD_ALLOWED_HOSTS needs a token behind it: without one, a page that
rebinds its own name to this box passes the Host check and meets nothing else."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.migrate import upgrade
from service.settings import Settings

TOKEN = "hosts-test-token-0123456789"
SPEC = {"recipe": "mlp-regression", "devices": 1, "accelerator": "cpu"}


def make_settings(tmp_path: Path, **changes: object) -> Settings:
    url = f"sqlite:///{tmp_path / 'trainyard.db'}"
    upgrade(url)
    values: dict[str, object] = {"database_url": url, "data_dir": tmp_path / "data"}
    return Settings(**{**values, **changes})  # type: ignore[arg-type]


@pytest.mark.parametrize("hosts", ["*", "gpu-box.lab, *.lab.example"])
def test_a_wildcard_without_a_token_is_refused_at_start(tmp_path: Path, hosts: str) -> None:
    """With '*' and no token, a rebinding page's POST /jobs got 201: the app now refuses
    to start, naming both settings, however it is served."""
    settings = make_settings(tmp_path, allowed_hosts=hosts, api_token=None)
    with pytest.raises(SystemExit) as refused:
        settings.require_safe_bind()
    message = str(refused.value)
    assert "TRAINYARD_ALLOWED_HOSTS=" in message and "without TRAINYARD_API_TOKEN" in message
    app = create_app(settings)
    with pytest.raises(ValueError) as at_start:
        app.build_middleware_stack()  # what the app does as it takes its first call
    assert str(at_start.value) == message


def test_a_wildcard_with_a_token_or_exact_names_without_one_serve(tmp_path: Path) -> None:
    with_token = make_settings(tmp_path, allowed_hosts="*", api_token=TOKEN)
    with_token.require_safe_bind()
    with TestClient(create_app(with_token)) as client:
        r = client.post("/api/v1/jobs", json=SPEC, headers={"Host": "rebound.evil.example"})
        assert r.status_code == 401  # the token, not the Host, stops the page
    exact = make_settings(tmp_path, allowed_hosts="gpu-box.lab", api_token=None)
    exact.require_safe_bind()
    with TestClient(create_app(exact)) as client:
        r = client.post("/api/v1/jobs", json=SPEC, headers={"Host": "rebound.evil.example"})
        assert r.status_code == 400


def test_trainyard_serve_says_why_and_exits(tmp_path: Path) -> None:
    """What an operator sees: one line naming both settings, no traceback, a failed exit."""
    url = f"sqlite:///{tmp_path / 'trainyard.db'}"
    upgrade(url)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("TRAINYARD_")},
        "TRAINYARD_DATABASE_URL": url,
        "TRAINYARD_DATA_DIR": str(tmp_path / "data"),
        "TRAINYARD_ALLOWED_HOSTS": "*",
    }
    done = subprocess.run(
        [sys.executable, "-c", "from service.cli import main; main()", "serve"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "refusing TRAINYARD_ALLOWED_HOSTS=* without TRAINYARD_API_TOKEN" in done.stderr
    assert "Traceback" not in done.stderr
