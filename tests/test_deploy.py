"""docker-compose.yml and Dockerfile, checked without a Docker engine (none runs here)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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
    assert services["api"]["environment"]["TRAINYARD_API_TOKEN"].startswith(
        "${TRAINYARD_API_TOKEN:?"
    )
    # The worker reads blobs from the shared volume: it needs no token, so none is there
    # for a job to find (issue 16, item 6).
    assert "TRAINYARD_API_TOKEN" not in services["worker"]["environment"]
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


def test_compose_file_follows_the_compose_specification() -> None:
    """The Compose Specification's own JSON Schema (the one `docker compose` implements;
    Debian's docker-compose 1.29 predates `depends_on.required` and cannot check it)."""
    checker = Path(sys.executable).parent / "check-jsonschema"
    result = subprocess.run(
        [str(checker), "--builtin-schema", "vendor.compose-spec", str(REPO / "docker-compose.yml")],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_postgres_profile_is_opt_in_and_the_services_wait_for_it() -> None:
    services = compose()["services"]
    postgres = services["postgres"]
    assert postgres["profiles"] == ["postgres"] and postgres["image"].startswith("postgres:")
    assert "pg_isready" in postgres["healthcheck"]["test"]
    assert postgres["volumes"] == ["postgres-data:/var/lib/postgresql/data"]
    assert "postgres-data" in compose()["volumes"]
    for name in ("api", "worker"):
        wait = services[name]["depends_on"]["postgres"]
        # waits on the healthcheck when the profile is on; ignored when it is off
        assert wait == {"condition": "service_healthy", "required": False}
        database = services[name]["environment"]["TRAINYARD_DATABASE_URL"]
        assert database == "${TRAINYARD_DATABASE_URL:-sqlite:////data/trainyard.db}"
