"""Script jobs at submit: every bad spec and every bad or missing input is a 422 naming
the field (and the package entry), with nothing left behind: no job, no blob use. A good
one attaches its blobs in the submit's own transaction, and a worker claims it whatever
recipes it has. On a real SQLite file and on PostgreSQL."""

from __future__ import annotations

import hashlib
import io
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text

from service import blob_rows, store
from service.app import create_app
from service.db import read_session, write_session
from service.errors import SpecInvalid
from service.models import JobCreate
from service.settings import Settings
from tests.service.test_packages import lie_about_size, make_zip, typed


def zipped(entries: list[tuple[str | zipfile.ZipInfo, bytes]]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in entries:
            archive.writestr(name, data)
    return buffer.getvalue()


PACKAGE = zipped([("train.py", b"print('hello')\n")])


@pytest.fixture
def api(settings: Settings, engine: Engine, add_worker: Callable[..., Any]) -> Iterator[TestClient]:
    with engine.begin() as conn:  # the PostgreSQL database is shared by the test run
        for table in ("job_blob", "blob", "metric", "log_line", "job"):
            conn.execute(text(f"DELETE FROM {table}"))
    add_worker()
    with TestClient(create_app(settings, engine)) as client:
        yield client


def put(api: TestClient, data: bytes) -> str:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    assert api.put(f"/api/v1/blobs/{digest}", content=data).status_code in (200, 201)
    return digest


def jobs(api: TestClient) -> int:
    return int(api.get("/api/v1/jobs").json()["total"])


def script(code: str, **spec: Any) -> dict[str, Any]:
    return {"code": code, "entrypoint": ["python", "train.py"], "accelerator": "cpu", **spec}


def refused(api: TestClient, spec: dict[str, Any]) -> Any:
    r = api.post("/api/v1/jobs", json=spec)
    assert r.status_code == 422, r.text
    assert jobs(api) == 0  # nothing enqueued
    return r.json()["detail"]


def test_a_script_job_is_accepted_and_uses_its_blobs(api: TestClient, engine: Engine) -> None:
    code, data = put(api, PACKAGE), put(api, b"1,2,3\n")
    r = api.post("/api/v1/jobs", json=script(code, data={"rows.csv": data}, devices=2))
    assert r.status_code == 201, r.text
    job = r.json()
    assert job["recipe"] is None and job["entrypoint"] == ["python", "train.py"]
    assert job["data"] == {"rows.csv": data} and job["code"] == code
    uses = {(u["job_id"], u["role"]) for u in api.get(f"/api/v1/blobs/{data}").json()["jobs"]}
    assert uses == {(job["id"], "data:rows.csv")}
    assert api.delete(f"/api/v1/blobs/{code}").status_code == 409  # a queued job needs it
    rerun = api.post(f"/api/v1/jobs/{job['id']}/rerun")
    assert rerun.status_code == 201 and rerun.json()["code"] == code
    # a worker that offers no recipe at all still runs scripts
    claim = store.claim_job(
        engine, worker_id="w", free_devices=2, accelerator="cpu", recipes=[], lease_s=30
    )
    assert claim is not None and claim.fence.job_id == job["id"] and claim.script


@pytest.mark.parametrize(
    ("spec", "loc", "words"),
    [
        ({"recipe": "tiny", "entrypoint": ["python", "x.py"]}, "entrypoint", "not both"),
        ({"entrypoint": ["python", "x.py"]}, "code", "code package"),
        ({"accelerator": "cpu"}, "recipe", "give a recipe"),
        ({"recipe": "tiny", "data": {"x.csv": "sha256:" + "0" * 64}}, "data", "bring code"),
        ({"recipe": "tiny", "requirements": ["numpy"]}, "requirements", "script jobs"),
        ({"recipe": "tiny", "code": "sha256:" + "0" * 64}, "code", "is not stored"),
    ],
)
def test_specs_that_mix_recipes_and_scripts_are_refused(
    api: TestClient, spec: dict[str, Any], loc: str, words: str
) -> None:
    [error] = refused(api, spec)
    assert error["loc"][1] == loc and words in error["msg"], error


@pytest.mark.parametrize("field", ["epochs", "batch_size", "lr", "checkpoint_every"])
def test_recipe_settings_on_a_script_job_are_refused(api: TestClient, field: str) -> None:
    [error] = refused(api, script(put(api, PACKAGE), **{field: 2}))
    assert error["loc"] == ["body", field] and "entrypoint" in error["msg"]


def test_a_script_job_takes_params_for_its_own_reading(api: TestClient) -> None:
    # they reach the script as JSON in TRAINYARD_PARAMS (a sweep's values among them)
    r = api.post("/api/v1/jobs", json=script(put(api, PACKAGE), params={"width": 4}))
    assert r.status_code == 201 and r.json()["params"] == {"width": 4}, r.text


@pytest.mark.parametrize("name", ["../x", ".hidden", "a/b", "", "x" * 201])
def test_data_names_must_be_plain_file_names(api: TestClient, name: str) -> None:
    refused(api, script(put(api, PACKAGE), data={name: put(api, b"x")}))


@pytest.mark.parametrize("bad", [{"entrypoint": []}, {"code": "sha256:abc"}, {"data": ["x"]}])
def test_malformed_script_fields_are_refused(api: TestClient, bad: dict[str, Any]) -> None:
    refused(api, {**script(put(api, PACKAGE)), **bad})


def test_a_recipe_from_a_package_needs_its_recipes_module(api: TestClient) -> None:
    spec = {"recipe": "mine", "code": put(api, PACKAGE), "accelerator": "cpu"}
    [error] = refused(api, spec)
    assert error["loc"] == ["body", "code"] and "trainyard_recipes.py" in error["msg"]
    with_module = zipped([("trainyard_recipes.py", b"")])
    r = api.post("/api/v1/jobs", json={**spec, "code": put(api, with_module)})
    assert r.status_code == 201, r.text  # its params are checked when a worker claims it


def test_inputs_that_are_not_stored_are_refused_naming_the_field(api: TestClient) -> None:
    missing = "sha256:" + "1" * 64
    [error] = refused(api, script(missing))
    assert error["loc"] == ["body", "code"] and f"PUT /api/v1/blobs/{missing}" in error["msg"]
    [error] = refused(api, script(put(api, PACKAGE), data={"x.csv": missing}))
    assert error["loc"] == ["body", "data", "x.csv"]


@pytest.mark.parametrize(
    ("entries", "entry"),
    [
        ([("../evil.py", b"x")], "../evil.py"),
        ([("/etc/cron.d/x", b"x")], "/etc/cron.d/x"),
        ([(typed("link", 0o120000), b"/etc/passwd")], "link"),
        ([(typed("dev", 0o020000), b"")], "dev"),
    ],
)
def test_an_unsafe_package_is_refused_naming_the_entry(
    api: TestClient, entries: list[tuple[str | zipfile.ZipInfo, bytes]], entry: str
) -> None:
    detail = refused(api, script(put(api, zipped([("train.py", b""), *entries]))))
    assert f"entry {entry!r}" in detail


def test_too_many_files_and_a_zip_bomb_are_refused(
    settings: Settings, engine: Engine, add_worker: Callable[..., Any]
) -> None:
    strict = settings.model_copy(update={"max_package_files": 3, "max_package_unpacked_bytes": 100})
    add_worker()
    with TestClient(create_app(strict, engine)) as api:
        many = put(api, zipped([(f"f{i}.py", b"") for i in range(4)]))
        assert "TRAINYARD_MAX_PACKAGE_FILES" in refused(api, script(many))
        bomb = put(api, zipped([("train.py", b"\0" * 101)]))
        assert "TRAINYARD_MAX_PACKAGE_UNPACKED_BYTES" in refused(api, script(bomb))
        junk = put(api, b"not a zip")
        assert "not a readable zip" in refused(api, script(junk))


def test_a_blob_removed_after_the_check_refuses_the_job(api: TestClient, engine: Engine) -> None:
    code = put(api, PACKAGE)
    with write_session(engine) as session:  # as a sweep between the check and the insert
        blob_rows.remove(session, code)
    with pytest.raises(SpecInvalid, match="removed after the check"):
        store.create_job(engine, JobCreate(**script(code)))
    with read_session(engine) as session:
        assert store.list_jobs(session, status=None, limit=10, offset=0)[1] == 0


def test_a_rerun_is_refused_as_a_submit_of_its_spec_is(
    settings: Settings, engine: Engine, add_worker: Callable[..., Any]
) -> None:
    """A rerun runs a submit's checks in a submit's order: a user at their limit on queued
    jobs hears so (429) before hearing that the package is gone (422), whichever way the
    job comes. A rerun used to check the inputs before the limit: a 422 where a submit of
    the same spec was a 429."""
    capped = settings.model_copy(update={"max_queued_jobs_per_user": 1})
    add_worker()
    with TestClient(create_app(capped, engine)) as api:
        code = put(api, PACKAGE)
        old = api.post("/api/v1/jobs", json=script(code)).json()
        assert api.post(f"/api/v1/jobs/{old['id']}/cancel").status_code == 202
        assert api.delete(f"/api/v1/blobs/{code}").status_code == 204  # no queued job uses it

        def submit_and_rerun() -> list[Any]:
            """Its spec, submitted anew and rerun."""
            return [
                api.post("/api/v1/jobs", json=script(code)),
                api.post(f"/api/v1/jobs/{old['id']}/rerun"),
            ]

        submit, rerun = submit_and_rerun()  # under the limit: the gone package
        assert submit.status_code == rerun.status_code == 422, rerun.text
        assert rerun.json()["detail"] == submit.json()["detail"]
        assert "is not stored" in rerun.json()["detail"][0]["msg"]

        r = api.post("/api/v1/jobs", json={"recipe": "tiny", "accelerator": "cpu"})
        assert r.status_code == 201, r.text
        submit, rerun = submit_and_rerun()  # at the limit: the limit, before the package
        assert submit.status_code == rerun.status_code == 429, rerun.text
        assert rerun.json()["detail"] == submit.json()["detail"]
        assert "TRAINYARD_MAX_QUEUED_JOBS_PER_USER" in rerun.json()["detail"]
        assert jobs(api) == 2  # the cancelled one and the recipe job: nothing enqueued


OUTSIDE = [
    "-r /etc/hostname",
    "--requirement=/etc/hostname",
    "-c ../constraints.txt",
    "-rsub/../../up.txt",
    "--constraint ~/.netrc",
    "-r ${HOME}/.netrc",
    "pkg @ file:///etc/hostname",
    "-e /srv/someone-elses-project",
    "--find-links ../wheels",
    "-i file:///var/lib/index",
    "--requirem /etc/hostname",  # pip takes an abbreviated option for the whole
]
INSIDE = [
    "numpy>=1.26; python_version >= '3.11'",
    "-r more.txt",
    "-c sub/../constraints.txt",
    "-e .",
    "./wheels/x-1.0-py3-none-any.whl",
    "--find-links ./wheels",
    "-i https://pypi.org/simple",
    "pkg @ git+https://example.org/pkg.git",
]


def test_requirement_lines_naming_a_file_outside_the_package_are_refused(
    api: TestClient,
) -> None:
    """pip reads a file a line names wherever it is, and its error shows what it read:
    ``-r /etc/hostname`` put that file into the job's reason. Each such line is refused
    at once, naming it."""
    code = put(api, PACKAGE)
    detail = refused(api, script(code, requirements=[*INSIDE, *OUTSIDE]))
    assert [e["loc"] for e in detail] == [
        ["body", "requirements", len(INSIDE) + i] for i in range(len(OUTSIDE))
    ]
    for error, line in zip(detail, OUTSIDE, strict=True):
        assert (
            f"requirement line {line!r}" in error["msg"]
            and "outside the code package" in error["msg"]
        )


def test_a_line_continued_on_the_next_is_refused(api: TestClient) -> None:
    """pip joins a line ending in a backslash with the next: ``-r .\\``, ``./.\\`` and
    ``./etc/hostname`` each stay in the package alone, and together read ../../etc."""
    code = put(api, PACKAGE)
    detail = refused(api, script(code, requirements=["-r .\\", "./.\\", "./etc/hostname"]))
    assert [e["loc"][-1] for e in detail] == [0, 1]
    assert "ends with a backslash" in detail[0]["msg"]


def test_requirement_lines_naming_the_packages_own_files_are_accepted(api: TestClient) -> None:
    code = put(api, PACKAGE)
    r = api.post("/api/v1/jobs", json=script(code, requirements=INSIDE))
    assert r.status_code == 201, r.text


def test_a_package_that_lies_about_its_sizes_is_refused_at_submit(
    api: TestClient, tmp_path: Path
) -> None:
    """Its data is read at submit: such a package had been queued, and each attempt of its
    job failed unpacking it on the worker."""
    archive = make_zip(tmp_path / "liar.zip", [("train.py", b"#" * 10_000)])
    lie_about_size(archive, b"train.py", 100)
    detail = refused(api, script(put(api, archive.read_bytes())))
    assert "code package entry 'train.py'" in detail and "not as declared" in detail
