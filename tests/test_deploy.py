"""docker-compose.yml and Dockerfile, checked without a Docker engine: `make image-check`
(scripts/image_check.sh) builds the image and runs the stack for real, as root."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


def compose() -> dict:  # type: ignore[type-arg]
    return yaml.safe_load((REPO / "docker-compose.yml").read_text())  # type: ignore[no-any-return]


class ComposeLoader(yaml.SafeLoader):
    """YAML as Compose reads an override: ``!reset`` drops what the file before it set."""


ComposeLoader.add_constructor("!reset", lambda loader, node: "!reset")


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
    # for a job's code, which runs under the worker, to find.
    assert "TRAINYARD_API_TOKEN" not in services["worker"]["environment"]
    assert services["worker"]["depends_on"]["api"]["condition"] == "service_healthy"
    assert services["worker"]["healthcheck"]["test"][-1] == "workers.supervisor.healthcheck"


def test_the_worker_starts_jobs_as_an_account_of_their_own() -> None:
    """The API runs as the image's user; the worker as root only to start each job as
    trainyard-job, an account the image makes with no home and no shell."""
    services = compose()["services"]
    assert "user" not in services["api"]
    assert services["worker"]["user"] == "0:0"
    assert services["worker"]["environment"]["TRAINYARD_JOB_USER"] == "trainyard-job"
    dockerfile = (REPO / "Dockerfile").read_text()
    assert "--shell /usr/sbin/nologin" in dockerfile and "trainyard-job" in dockerfile


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


def test_the_cpu_override_only_swaps_the_gpus_and_takes_the_host_network() -> None:
    """tests/deploy/compose.cpu.yml, what image_check.sh runs: no bridge network is made
    (every service on the host's network, none publishing a port), no GPU reserved, and the
    servers listen on loopback."""
    override = yaml.load((REPO / "tests/deploy/compose.cpu.yml").read_text(), Loader=ComposeLoader)
    assert set(override) == {"services"}  # no networks, volumes or images of its own
    services = override["services"]
    assert set(services) == set(compose()["services"])
    for name, service in services.items():
        assert service["network_mode"] == "host", name
        assert "image" not in service and "build" not in service, name
    assert services["api"]["ports"] == services["postgres"]["ports"] == "!reset"
    assert services["worker"]["deploy"] == "!reset"
    assert services["api"]["environment"]["TRAINYARD_HOST"] == "127.0.0.1"
    assert "listen_addresses=127.0.0.1" in services["postgres"]["command"]


def test_the_build_context_is_what_the_dockerfile_copies() -> None:
    """.dockerignore lets in only the sources the Dockerfile copies: no .venv (1.5 GB),
    data, .git or tests in the context, so none in the image."""
    lines = (REPO / ".dockerignore").read_text().splitlines()
    rules = [line for line in lines if line and not line.startswith("#")]
    assert rules[0] == "*"
    allowed = {rule.removeprefix("!").rstrip("/") for rule in rules if rule.startswith("!")}
    copied = {
        source.rstrip("/")
        for line in (REPO / "Dockerfile").read_text().splitlines()
        if line.startswith("COPY ")
        for source in line.split()[1:-1]
    }
    assert copied == allowed


def test_the_dockerfile_names_nothing_of_a_build_machine() -> None:
    """A mirror or proxy reaches pip as a build secret (image_check.sh passes this box's);
    the Dockerfile stays generic: PyPI's torch, the CUDA build on a GPU box."""
    text = (REPO / "Dockerfile").read_text()
    assert text.count("--mount=type=secret,id=pip.conf,target=/etc/pip.conf") == 2
    for local in ("/opt/", "+cpu", "index-url", "find-links", "trusted-host", "ARG "):
        assert local not in text, local
    assert "FROM python:3.11-slim-bookworm" in text


def test_minio_profile_is_opt_in_with_no_default_keys_and_storage_is_off_unless_set() -> None:
    """The `minio` profile adds an S3-compatible server (pinned, on loopback, refusing to
    start without keys: MinIO's own defaults are well known); the api and worker get the
    storage settings from the environment, empty when unset, so nothing changes then."""
    services = compose()["services"]
    minio = services["minio"]
    assert minio["profiles"] == ["minio"]
    assert minio["image"].startswith("minio/minio:RELEASE.")  # a release, never :latest
    assert minio["command"][:2] == ["server", "/data"]
    assert minio["volumes"] == ["minio-data:/data"] and "minio-data" in compose()["volumes"]
    assert minio["environment"] == {
        "MINIO_ROOT_USER": "${MINIO_ROOT_USER:-}",
        "MINIO_ROOT_PASSWORD": "${MINIO_ROOT_PASSWORD:-}",
    }
    guard = minio["entrypoint"][2]
    assert '"$$MINIO_ROOT_USER"' in guard and '"$$MINIO_ROOT_PASSWORD"' in guard
    assert "mc" in minio["healthcheck"]["test"]
    assert all(p.startswith(("${MINIO_BIND:-127.0.0.1}:", "127.0.0.1:")) for p in minio["ports"])
    for name in ("api", "worker"):
        assert services[name]["depends_on"]["minio"] == {
            "condition": "service_healthy",
            "required": False,
        }
        env = services[name]["environment"]
        for var in (
            "TRAINYARD_STORAGE_URL",
            "AWS_ENDPOINT_URL",
            "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY",
        ):
            assert env[var] == f"${{{var}:-}}", (name, var)
