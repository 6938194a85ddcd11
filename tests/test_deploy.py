"""docker-compose.yml and Dockerfile, checked without a Docker engine (none runs here)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]


def compose() -> dict:  # type: ignore[type-arg]
    return yaml.safe_load((REPO / "docker-compose.yml").read_text())  # type: ignore[no-any-return]


def test_worker_reserves_gpus_and_shares_the_data_volume_with_the_api() -> None:
    services = compose()["services"]
    gpu = services["worker"]["deploy"]["resources"]["reservations"]["devices"][0]
    assert gpu["driver"] == "nvidia" and "gpu" in gpu["capabilities"]
    for name in ("api", "worker"):
        assert "trainyard-data:/data" in services[name]["volumes"]
        assert services[name]["environment"]["TRAINYARD_API_TOKEN"].startswith(
            "${TRAINYARD_API_TOKEN:?"
        )
    assert services["worker"]["depends_on"]["api"]["condition"] == "service_healthy"
    assert services["worker"]["healthcheck"]["test"][-1] == "workers.healthcheck"


def test_dockerfile_runs_as_non_root_with_a_healthcheck() -> None:
    text = (REPO / "Dockerfile").read_text()
    users = [line.split()[1] for line in text.splitlines() if line.startswith("USER ")]
    assert users and users[-1] not in ("root", "0")
    assert "HEALTHCHECK" in text and "/healthz" in text


def test_dockerfile_passes_hadolint() -> None:
    hadolint = Path(sys.executable).parent / "hadolint"
    result = subprocess.run(
        [str(hadolint), str(REPO / "Dockerfile")], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.skipif(
    shutil.which("docker-compose") is None, reason="Debian's docker-compose not installed"
)
def test_compose_config_is_valid() -> None:
    env = {**os.environ, "TRAINYARD_API_TOKEN": "t"}
    ok = subprocess.run(
        ["docker-compose", "config", "-q"], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert ok.returncode == 0, ok.stderr
    env.pop("TRAINYARD_API_TOKEN")
    refused = subprocess.run(
        ["docker-compose", "config", "-q"], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert refused.returncode != 0 and "TRAINYARD_API_TOKEN" in refused.stderr
