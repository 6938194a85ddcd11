"""The client's models are the API's schemas: the same names and fields as the server's
OpenAPI components, so a field the server adds or renames cannot go unnoticed."""

from __future__ import annotations

import inspect
from pathlib import Path

from pydantic import BaseModel

from service.app import create_app
from service.settings import Settings
from trainyard import models

OWN = {"BaseModel", "Model", "Page", "Event"}  # bases, and a stream's event: not schemas


def client_models() -> dict[str, type[BaseModel]]:
    return {
        name: cls
        for name, cls in vars(models).items()
        if inspect.isclass(cls)
        and issubclass(cls, BaseModel)
        and name not in OWN
        and "[" not in name  # Page[JobRead]: pydantic names a parametrized page here too
    }


def test_every_client_model_has_the_fields_of_the_api_schema_of_its_name(tmp_path: Path) -> None:
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'db'}", data_dir=tmp_path)
    schemas = create_app(settings).openapi()["components"]["schemas"]
    for name, cls in client_models().items():
        assert name in schemas, f"the API has no schema {name}"
        schema = schemas[name]
        assert set(cls.model_fields) == set(schema["properties"]), name
        # A field the client requires must be one the API always fills: required there,
        # or given a value by the server when not (a default factory: no default shown).
        required = {f for f, info in cls.model_fields.items() if info.is_required()}
        optional = required - set(schema.get("required", []))
        maybe_null = {f for f in optional if "default" in schema["properties"][f]}
        assert not maybe_null, f"{name}: the client requires {maybe_null}, the API may omit"


def test_the_client_reads_every_schema_the_cli_and_users_meet() -> None:
    wanted = {"JobRead", "JobList", "MetricRead", "LogLineRead", "ArtifactRead", "SweepRead"}
    assert wanted <= set(client_models())


def test_statuses_are_the_apis(tmp_path: Path) -> None:
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'db'}", data_dir=tmp_path)
    schemas = create_app(settings).openapi()["components"]["schemas"]
    assert [s.value for s in models.JobStatus] == schemas["JobStatus"]["enum"]
    assert [s.value for s in models.SweepStatus] == schemas["SweepStatus"]["enum"]


def test_a_status_this_client_does_not_know_still_reads() -> None:
    """A newer server's status: the answer that holds it is read, the status kept as is."""
    read = models.JobRead.model_validate_json(
        b'{"id": 1, "owner": "a", "status": "paused", "created_at": "2026-12-02T00:00:00Z"}'
    )
    assert read.status == "paused" and not read.status.finished
    assert models.SweepStatus("resting") == "resting"
    assert list(models.JobStatus)[-1] == models.JobStatus.cancelled, "members unchanged"
