"""A job's inputs on the worker: a code package that unpacks on no worker (a member
holding more or fewer bytes than the archive declares) fails its job once, not retried,
saying which entry; the worker's cache keeps nothing of it."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from service.blobs import BlobStore
from service.models import Job
from service.reasons import ReasonCode
from service.settings import Settings
from tests.service.test_packages import lie_about_size, make_zip
from workers.errors import NotRetryable, describe
from workers.jobfiles import JobFiles
from workers.supervisor import inputs


@pytest.mark.parametrize("declared", [100, 100_000])  # a bomb's lie, and a truncated member
def test_a_package_that_lies_about_its_sizes_fails_its_job_once(
    tmp_path: Path, declared: int
) -> None:
    """Such a package passed the API's look at its directory, then failed unpacking on
    every attempt: an error like a lost worker's, retried until max_attempts was spent."""
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'db'}", data_dir=tmp_path / "data")
    archive = make_zip(tmp_path / "liar.zip", [("train.py", b"#" * 10_000)])
    lie_about_size(archive, b"train.py", declared)
    data = archive.read_bytes()
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    stored = BlobStore.from_settings(settings).path(digest)
    stored.parent.mkdir(parents=True)
    stored.write_bytes(data)  # as the API stored it before it read packages through
    job = Job(id=7, code=digest, entrypoint=["python", "train.py"])
    with pytest.raises(NotRetryable) as failed:
        inputs.place(settings, job, JobFiles.of(settings.data_dir, 7))
    error = describe(failed.value)
    assert error["retryable"] is False and error["code"] == ReasonCode.bad_spec
    assert "code package entry 'train.py'" in error["message"]
    assert not list((settings.cache_path / "code").iterdir())  # no half-unpacked entry
