"""The supervisor in this process, on a SQLite file: it claims, runs and ends real attempts
(runners are real processes), and drain mode ends the run once the queue is empty."""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from sqlalchemy import Engine, text

from service import store
from service.db import make_engine
from service.migrate import upgrade
from service.models import Job, JobCreate
from service.settings import Settings
from tests.stack import RECIPES_DIR, REPO, wait_for
from workers.jobfiles import JobFiles
from workers.outcome import RunnerReport
from workers.procfs import group_members
from workers.supervisor.loop import Supervisor

pytestmark = pytest.mark.slow

# Its first attempt's runner exits without a word (as a segfault or the OOM killer would
# leave it); the next one trains.
DIES_ONCE = """
import os
from pathlib import Path

import torch
from pydantic import BaseModel
from torch import nn
from torch.utils.data import TensorDataset

from workers.recipes import Recipe


class Params(BaseModel):
    marker: str


def _data(p: Params, seed: int) -> tuple[TensorDataset, TensorDataset]:
    if not Path(p.marker).exists():
        Path(p.marker).touch()
        os._exit(9)
    x = torch.randn(64, 4, generator=torch.Generator().manual_seed(seed))
    return TensorDataset(x, x.sum(1, keepdim=True)), TensorDataset(x, x.sum(1, keepdim=True))


dies_once = Recipe(
    name="dies_once",
    summary="Exits without a report on its first attempt.",
    params=Params,
    build_model=lambda p: nn.Linear(4, 1),
    build_datasets=_data,
    loss=nn.functional.mse_loss,
)
"""
SLOW = {"samples": 4096, "sleep_per_step_s": 0.05}  # long enough to be stopped midway


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """A SQLite file, the test recipes and one that dies once, two CPU slots."""
    url = f"sqlite:///{tmp_path / 'trainyard.db'}"
    upgrade(url)
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    for path in RECIPES_DIR.glob("*.py"):
        shutil.copy(path, recipes)
    (recipes / "dies_once.py").write_text(DIES_ONCE)
    monkeypatch.setenv("PYTHONPATH", str(REPO))  # runners import workers.* from here
    return Settings(
        database_url=url,
        data_dir=tmp_path / "data",
        recipes_dir=recipes,
        cpu_slots=2,
        api_token=None,
        heartbeat_interval_s=0.2,  # cancels are seen within this
        kill_grace_s=3,
    )


@pytest.fixture
def engine(settings: Settings) -> Iterator[Engine]:
    engine = make_engine(settings)
    yield engine
    engine.dispose()


def submit(engine: Engine, **spec: Any) -> int:
    job, _ = store.create_job(engine, JobCreate(**spec))
    assert job.id is not None
    return job.id


def system_lines(engine: Engine, job_id: int) -> list[str]:
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT text FROM log_line WHERE job_id = :id AND stream = 'system' ORDER BY seq"),
            {"id": job_id},
        )
        return [row[0] for row in rows]


class InThread:
    """A supervisor running in a thread, for tests that act on it while it works."""

    def __init__(self, supervisor: Supervisor, *, drain: bool = True) -> None:
        self.supervisor = supervisor
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(drain,), daemon=True)
        self.thread.start()

    def _run(self, drain: bool) -> None:
        try:
            self.supervisor.run(drain=drain)
        except BaseException as exc:  # re-raised in the test's thread by join()
            self.error = exc

    def join(self, timeout_s: float = 60) -> None:
        self.thread.join(timeout_s)
        assert not self.thread.is_alive(), "the supervisor did not stop"
        if self.error is not None:
            raise self.error


def running_with_progress(engine: Engine, job_id: int) -> Job:
    def training() -> Job | None:
        job = store.load_job(engine, job_id)
        return job if job.status == "running" and job.progress else None

    return wait_for(training, 30, f"job {job_id} to train")


@pytest.mark.parametrize("warm_start", [True, False], ids=["zygote", "cold"])
def test_a_job_that_succeeds_is_finished(
    settings: Settings, engine: Engine, warm_start: bool
) -> None:
    job_id = submit(engine, recipe="tiny", epochs=1)
    Supervisor(settings, worker_id="t", warm_start=warm_start).run(drain=True)
    job = store.load_job(engine, job_id)
    assert (job.status, job.reason_code, job.attempt) == ("succeeded", "succeeded", 1)
    assert job.result
    lines = system_lines(engine, job_id)
    assert lines[0].startswith("attempt 1 started on t, cpu devices [0], runner pid ")
    assert group_members(int(lines[0].rsplit(" ", 1)[1])) == []  # nothing of it is left
    assert lines[-1] == "attempt 1 ended: trained"


def test_a_runner_that_dies_without_a_report_is_retried(
    settings: Settings, engine: Engine, tmp_path: Path
) -> None:
    job_id = submit(engine, recipe="dies_once", params={"marker": str(tmp_path / "died")})
    # What an earlier run of attempt 1 left when it was handed back (a job keeps its
    # attempt number then): it must not speak for the run that dies.
    stale = JobFiles.of(settings.data_dir, job_id).outcome(1)
    RunnerReport(ok=False, preempted="stopped at epoch 1, batch 3, step 3").write(stale)
    Supervisor(settings, worker_id="t").run(drain=True)  # drains after the retry back-off
    job = store.load_job(engine, job_id)
    assert (job.status, job.attempt) == ("succeeded", 2)
    lines = system_lines(engine, job_id)
    assert "attempt 1 ended: runner exited with 9 before reporting" in lines
    assert lines[-1] == "attempt 2 ended: trained"


def test_a_cancel_stops_the_attempt(settings: Settings, engine: Engine) -> None:
    job_id = submit(engine, recipe="tiny", epochs=5, params=SLOW)
    worker = InThread(Supervisor(settings, worker_id="t"))
    pgid = running_with_progress(engine, job_id).runner_pgid
    store.cancel_job(engine, job_id)
    worker.join()
    job = store.load_job(engine, job_id)
    assert (job.status, job.reason_code, job.attempt) == ("cancelled", "cancelled", 1)
    assert pgid is not None and group_members(pgid) == []


def test_a_shutdown_hands_the_job_back_without_spending_an_attempt(
    settings: Settings, engine: Engine
) -> None:
    job_id = submit(engine, recipe="tiny", epochs=5, params=SLOW)
    supervisor = Supervisor(settings, worker_id="t")
    worker = InThread(supervisor, drain=False)
    pgid = running_with_progress(engine, job_id).runner_pgid
    supervisor.stop()
    worker.join()
    job = store.load_job(engine, job_id)
    assert (job.status, job.reason_code, job.attempt) == ("queued", "worker_shutdown", 1)
    assert job.worker_id is None and pgid is not None and group_members(pgid) == []
    assert system_lines(engine, job_id)[-1].startswith("attempt 1 ended: worker t shut down")


def test_building_a_supervisor_starts_nothing(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    supervisor = Supervisor(settings, worker_id="t", kill_grace_s=5)
    assert supervisor.settings.kill_grace_s == 5 and settings.kill_grace_s == 3
    assert supervisor.launcher.zygote is None and supervisor.recipes == {}
    assert "CUDA_DEVICE_ORDER" not in os.environ
    supervisor.engine.dispose()


def test_overrides_are_checked(settings: Settings) -> None:
    with pytest.raises(TypeError, match="kill_grace"):
        Supervisor(settings, kill_grace=5)  # a typo must not be ignored
    with pytest.raises(ValidationError):
        Supervisor(settings, kill_grace_s=-1)
