"""The worker's cache kept to its budget: real entries on disk, evicted least recently used
first, never one an attempt holds (in this process or another, until that one dies) or a
virtualenv being built; a disk short of room takes no job and says why; and a worker
holding a running job's package through sweeps, shown on the workers' listing."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine
from sqlmodel import Session

from service import blob_rows, store
from service.blobs import BlobStore
from service.catalog import list_workers
from service.db import make_engine, write_session
from service.migrate import upgrade
from service.models import JobCreate, WorkerRead
from service.settings import Settings
from tests.stack import RECIPES_DIR, REPO, wait_for
from tests.workers.supervisor.test_supervisor import InThread
from trainyard.packing import pack
from workers import venv_names as venvs
from workers.supervisor import cache_budget
from workers.supervisor.cache_budget import GIB, CacheBudget
from workers.supervisor.loop import Supervisor

MIB = 2**20


def settings_for(tmp_path: Path, **knobs: Any) -> Settings:
    url = f"sqlite:///{tmp_path / 'trainyard.db'}"
    return Settings(database_url=url, data_dir=tmp_path / "data", api_token=None, **knobs)


def budget(tmp_path: Path, budget_mib: float = 1024, min_free_gb: float = 0) -> CacheBudget:
    return CacheBudget(
        settings_for(tmp_path, cache_budget_gb=budget_mib * MIB / GIB, min_free_disk_gb=min_free_gb)
    )


def make_entry(cache: Path, entry: str, *, age_s: float, mib: int = 1) -> Path:
    """An entry of ``mib`` MiB last changed ``age_s`` ago: a file in blobs/, else a folder."""
    path = cache / entry
    path.parent.mkdir(parents=True, exist_ok=True)
    data = os.urandom(mib * MIB)
    if entry.startswith("blobs/"):
        path.write_bytes(data)
    else:
        (path / "lib").mkdir(parents=True)
        (path / "lib" / "payload").write_bytes(data)
    when = path.stat().st_mtime - age_s
    os.utime(path, (when, when))
    return path


def present(cache: Path) -> set[str]:
    return {
        f"{kind}/{p.name}"
        for kind in ("code", "blobs", "venvs")
        for p in (cache / kind).glob("*")
        if not p.name.endswith(".lock")
    }


def test_an_over_budget_sweep_evicts_the_least_recently_used_but_never_a_held_entry(
    tmp_path: Path,
) -> None:
    cache = settings_for(tmp_path).cache_path
    for age, entry in enumerate(["code/ddd", "venvs/ccc", "blobs/bbb", "code/aaa"]):
        make_entry(cache, entry, age_s=100 * (age + 1))  # code/aaa the oldest
    roomy = budget(tmp_path)
    roomy.sweep()
    assert roomy.record()["entries"] == 4 and roomy.record()["size_bytes"] > 4 * MIB
    assert present(cache) == {"code/aaa", "blobs/bbb", "venvs/ccc", "code/ddd"}

    tight = budget(tmp_path, budget_mib=2.5)  # another instance: the index is on disk
    holds = tight.holds()
    holds.hold("code", "aaa")  # a running attempt's package: the oldest, but in use
    tight.sweep()
    assert present(cache) == {"code/aaa", "code/ddd"}
    assert tight.record()["entries"] == 2

    holds.release()  # the attempt ended: its package is now the most recently used
    budget(tmp_path, budget_mib=1.5).sweep()
    assert present(cache) == {"code/aaa"}


def test_an_entry_a_job_s_account_named_or_filled_does_not_stop_the_sweep(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """venvs/ is writable by the jobs' account: a name too long for a hold file's (it was
    the entry's own name) failed every sweep, and a folder of a million files would keep
    the loop that renews leases walking."""
    cache = settings_for(tmp_path).cache_path
    long_name = "v" * 250
    make_entry(cache, f"venvs/{long_name}", age_s=300)
    many = make_entry(cache, "venvs/many", age_s=200)
    for i in range(50):
        (many / "lib" / f"f{i}").write_bytes(b"x" * 4096)
    make_entry(cache, "code/aaa", age_s=100)
    monkeypatch.setattr(cache_budget, "MEASURE_MAX_FILES", 10)
    tight = budget(tmp_path, budget_mib=1.5)
    tight.sweep()  # the oldest goes: the one with the long name
    assert present(cache) == {"code/aaa", "venvs/many"}
    # the many-file one is known by its first 10 files: less than it holds, and at once
    index = json.loads((cache / ".index.json").read_text())
    assert 0 < index["venvs/many"]["bytes"] < MIB


def test_a_hold_is_its_worker_process_s_and_no_crash_leaves_one_behind(tmp_path: Path) -> None:
    cache = settings_for(tmp_path).cache_path
    make_entry(cache, "code/aaa", age_s=100)
    child = (
        "import sys\n"
        "from tests.workers.supervisor.test_cache_budget import budget\n"
        "from pathlib import Path\n"
        "budget(Path(sys.argv[1])).holds().hold('code', 'aaa')\n"
        "print('held', flush=True)\n"
        "sys.stdin.read()\n"
    )
    with subprocess.Popen(
        [sys.executable, "-c", child, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    ) as worker:
        try:
            assert worker.stdout is not None and worker.stdout.readline() == "held\n"
            budget(tmp_path, budget_mib=0).sweep()
            assert present(cache) == {"code/aaa"}  # another worker's running attempt uses it
        finally:
            worker.send_signal(signal.SIGKILL)  # a crash: no release
    budget(tmp_path, budget_mib=0).sweep()
    assert present(cache) == set()


def test_a_virtualenv_being_built_is_not_evicted(tmp_path: Path) -> None:
    cache = settings_for(tmp_path).cache_path
    make_entry(cache, "venvs/k1", age_s=100)
    with venvs.lock_if_free(cache / "venvs", "k1") as building:  # as a job's pip holds it
        assert building
        budget(tmp_path, budget_mib=0).sweep()
        assert present(cache) == {"venvs/k1"}
    budget(tmp_path, budget_mib=0).sweep()
    assert present(cache) == set()


def test_a_script_job_s_virtualenv_is_held_by_the_key_its_runner_uses(tmp_path: Path) -> None:
    cache = settings_for(tmp_path).cache_path
    package = tmp_path / "package"
    package.mkdir()
    (package / "requirements.txt").write_text("# pinned\nsix==1.16.0  # the one\n")
    key = venvs.venv_key(venvs.requirement_lines(None, package), package)
    make_entry(cache, f"venvs/{key}", age_s=100)  # as the job's pip built it
    make_entry(cache, "venvs/another", age_s=50)
    holds = budget(tmp_path).holds()
    holds.hold_venv(None, package)  # no lines of its own: the package's requirements.txt
    budget(tmp_path, budget_mib=0).sweep()
    assert present(cache) == {f"venvs/{key}"}
    holds.release()
    budget(tmp_path, budget_mib=0).sweep()
    assert present(cache) == set()


def test_eviction_removes_links_and_read_only_folders_but_never_follows_a_link(
    tmp_path: Path,
) -> None:
    cache = settings_for(tmp_path).cache_path
    outside = tmp_path / "box"
    outside.mkdir()
    (outside / "precious").write_text("keep")
    venv = make_entry(cache, "venvs/k1", age_s=100)
    (venv / "lib" / "planted").symlink_to(outside)  # what a job's account could write
    (cache / "venvs" / "k2").symlink_to(outside)
    package = make_entry(cache, "code/abc", age_s=100)
    for folder in (package / "lib", package):  # unpacked packages are read-only
        folder.chmod(0o555)
    budget(tmp_path, budget_mib=0).sweep()
    assert present(cache) == set()
    assert (outside / "precious").read_text() == "keep"


def test_an_entry_is_measured_once_not_at_every_sweep(tmp_path: Path) -> None:
    cache = settings_for(tmp_path).cache_path
    blob = make_entry(cache, "blobs/bbb", age_s=100)
    first = budget(tmp_path)
    first.sweep()
    measured = first.record()["size_bytes"]
    with blob.open("ab") as grown:  # bytes no sweep walks for again
        grown.write(os.urandom(4 * MIB))
    again = budget(tmp_path)
    again.sweep()
    assert again.record()["size_bytes"] == measured


def test_a_disk_short_of_room_takes_no_job_evicts_what_it_can_and_says_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cache = settings_for(tmp_path).cache_path
    make_entry(cache, "code/held", age_s=100)
    make_entry(cache, "blobs/idle", age_s=200)
    full = budget(tmp_path, min_free_gb=1e9)  # more than any disk here has free
    holds = full.holds()
    holds.hold("code", "held")
    with caplog.at_level(logging.WARNING):
        reason = full.upkeep()
    assert reason is not None and "TRAINYARD_MIN_FREE_DISK_GB=1e+09" in reason
    assert f"taking no job: {reason}" in caplog.messages
    assert present(cache) == {"code/held"}  # under budget, but every unheld entry went
    record = full.record()
    assert record["refusing"] == reason and record["disk_free_bytes"] > 0
    holds.release()
    assert budget(tmp_path).upkeep() is None  # room again


# --- through a real worker ----------------------------------------------------------

WAITS_FOR_A_MARKER = """
import sys, time
from pathlib import Path

deadline = time.monotonic() + 60
while not Path(sys.argv[1]).exists() and time.monotonic() < deadline:
    time.sleep(0.05)
"""


@pytest.fixture
def worker_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    upgrade(settings_for(tmp_path).database_url)
    monkeypatch.setenv("PYTHONPATH", str(REPO))  # runners import workers.* from here
    return settings_for(
        tmp_path, recipes_dir=RECIPES_DIR, cpu_slots=1, heartbeat_interval_s=0.2, kill_grace_s=3
    )


@pytest.fixture
def engine(worker_settings: Settings) -> Iterator[Engine]:
    engine = make_engine(worker_settings)
    yield engine
    engine.dispose()


def listed(engine: Engine) -> WorkerRead | None:
    with Session(engine) as session:
        return next(iter(list_workers(session)), None)


@pytest.mark.slow
def test_a_worker_holds_a_running_job_s_package_through_sweeps_and_evicts_it_after(
    worker_settings: Settings, engine: Engine, tmp_path: Path
) -> None:
    source = tmp_path / "src"
    source.mkdir()
    (source / "main.py").write_text(WAITS_FOR_A_MARKER)
    packed = pack(source, tmp_path / "src.zip").path
    digest = "sha256:" + hashlib.sha256(packed.read_bytes()).hexdigest()
    stored = BlobStore.from_settings(worker_settings).path(digest)
    stored.parent.mkdir(parents=True)
    shutil.copy(packed, stored)
    with write_session(engine) as session:
        blob_rows.record(session, digest, stored.stat().st_size)
    marker = tmp_path / "go"
    job, _ = store.create_job(
        engine, JobCreate(code=digest, entrypoint=["python", "main.py", str(marker)])
    )
    unpacked = worker_settings.cache_path / "code" / digest.removeprefix("sha256:")
    supervisor = Supervisor(worker_settings, worker_id="t", cache_budget_gb=0)
    worker = InThread(supervisor)
    try:
        wait_for(lambda: store.load_job(engine, job.id).status == "running", 30, "the job")
        wait_for(unpacked.is_dir, 30, "its package unpacked")
        supervisor.cache.sweep()  # over its budget of 0, beside the loop's own sweeps
        assert unpacked.is_dir()
    finally:
        marker.touch()
    worker.join()
    assert store.load_job(engine, job.id).status == "succeeded"
    assert not unpacked.exists()  # swept before the claim that found the queue empty
    assert supervisor.cache.record()["entries"] == 0


@pytest.mark.slow
def test_a_worker_short_of_disk_takes_no_job_says_so_and_resumes_once_there_is_room(
    worker_settings: Settings, engine: Engine
) -> None:
    job, _ = store.create_job(engine, JobCreate(recipe="tiny", epochs=1))
    supervisor = Supervisor(worker_settings, worker_id="t", min_free_disk_gb=1e9)
    worker = InThread(supervisor, drain=False)
    try:
        shown = wait_for(lambda: listed(engine), 60, "the worker registered")
        assert shown.cache is not None and "TRAINYARD_MIN_FREE_DISK_GB" in shown.cache["refusing"]
        assert shown.cache["budget_bytes"] == 20 * GIB and shown.cache["disk_free_bytes"] > 0
        assert store.load_job(engine, job.id).status == "queued"  # refused since it started
        supervisor.cache.min_free_bytes = 0  # room again (as if a disk were freed)
        wait_for(lambda: store.load_job(engine, job.id).status == "succeeded", 60, "the job")
        wait_for(
            lambda: (w := listed(engine)) and w.cache and w.cache["refusing"] is None,
            10,
            "the listing to say the worker takes jobs again",
        )
    finally:
        supervisor.stop()
        worker.join()
