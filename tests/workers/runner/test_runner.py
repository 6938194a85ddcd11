"""The runner: one function from a Job to a RunSpec, the JSON it leaves, and the report
it writes for the supervisor however the attempt ends."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest

from service import store
from service.db import make_engine
from service.migrate import upgrade
from service.models import Accelerator, Job, JobCreate, Strategy
from service.reasons import ReasonCode
from service.settings import Settings
from tests.stack import RECIPES_DIR, REPO
from workers.errors import NotRetryable, describe
from workers.handoff import Handoff
from workers.jobfiles import JobFiles
from workers.outcome import RunnerReport
from workers.ranks.training import RunSpec, resolve
from workers.recipes import load_recipes
from workers.runner import environment

RECIPE = load_recipes()["mlp-classifier"]


def job(**kw: object) -> Job:
    return Job(id=5, recipe="mlp-classifier", params={"classes": 3}, **kw)


def test_auto_is_resolved_by_the_spec_rules_and_params_are_validated_once(tmp_path: Path) -> None:
    spec, params = resolve(
        job(strategy="auto", devices=2, accelerator="auto", batch_size=64),
        RECIPE,
        accelerator="cpu",
        threads=2,
        data_dir=tmp_path,
        recipes_dir=None,
        attempt=3,
    )
    assert spec.strategy is Strategy.ddp and spec.accelerator is Accelerator.cpu
    assert spec.world_size == 2 and spec.threads == 2 and spec.attempt == 3
    assert params.classes == 3 and spec.params == params.model_dump()  # type: ignore[attr-defined]
    assert spec.files == JobFiles.of(tmp_path, 5)


def test_dp_on_cpu_and_bad_params_are_not_retried(tmp_path: Path) -> None:
    where = {"accelerator": "cpu", "threads": 1, "data_dir": tmp_path, "recipes_dir": None}
    with pytest.raises(NotRetryable) as bad_spec:
        resolve(job(strategy="dp", devices=2), RECIPE, **where)
    with pytest.raises(NotRetryable) as bad_params:
        resolve(Job(id=5, recipe="mlp-classifier", params={"nope": 1}), RECIPE, **where)
    assert bad_spec.value.code is ReasonCode.bad_spec
    assert bad_params.value.code is ReasonCode.bad_params
    assert json.loads(json.dumps(describe(bad_params.value)))["code"] == "bad_params"


def test_spec_json_holds_plain_values_and_rebuilds_the_spec(tmp_path: Path) -> None:
    spec, _ = resolve(
        job(strategy="single", devices=1),
        RECIPE,
        accelerator="cpu",
        threads=1,
        data_dir=tmp_path,
        recipes_dir=None,
    )
    record = environment.record(spec, RECIPE, worker_id="w1")
    environment.write_spec(spec.files, record)
    written = json.loads(spec.files.spec.read_text())
    assert (
        written["strategy"] == "single" and written["environment"]["spec"]["optimizer"] == "adamw"
    )
    assert all(type(v) is not Strategy for v in record["spec"].values())
    # What a rerun does (the chaos tests too): the spec from spec.json's top level.
    names = {f.name for f in fields(RunSpec)} - {"job_dir", "recipes_dir", "package", "attempt"}
    again = RunSpec(**{k: written[k] for k in names}, job_dir=spec.job_dir)
    assert again == spec and again.strategy is Strategy.single


def _run_attempt(tmp_path: Path, recipe: str, params: dict[str, object]) -> tuple[int, Path]:
    """Claim a job on a fresh SQLite file and run its runner, as the launcher would
    (a process of its own: the runner rewires its stdio and signals)."""
    url = f"sqlite:///{tmp_path / 'trainyard.db'}"
    upgrade(url)
    engine = make_engine(Settings(database_url=url))
    try:
        job, _ = store.create_job(engine, JobCreate(recipe=recipe, params=params, epochs=1))
        claim = store.claim_job(
            engine, worker_id="w", free_devices=1, accelerator="cpu", recipes=[recipe], lease_s=60
        )
        assert claim is not None and job.id is not None
        settings = Settings(database_url=url, data_dir=tmp_path / "data", recipes_dir=RECIPES_DIR)
        # The job and the settings a runner needs come on stdin, as the launcher passes them.
        handoff = Handoff.of(store.load_job(engine, job.id), settings).model_dump_json()
        args = ["--job-id", str(job.id), "--attempt", "1", "--accelerator", "cpu"]
        done = subprocess.run(
            [sys.executable, "-m", "workers.runner.main", *args],
            input=handoff,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert store.load_job(engine, job.id).status == "running"  # the runner never moves it
    finally:
        engine.dispose()
    return done.returncode, JobFiles.of(tmp_path / "data", job.id).outcome(1)


@pytest.mark.slow
def test_a_runner_that_trains_reports_its_result(tmp_path: Path) -> None:
    code, outcome = _run_attempt(tmp_path, "tiny", {"samples": 64})
    report = RunnerReport.read(outcome)
    assert code == 0 and report is not None and report.ok
    assert report.result is not None and "val/loss" in report.result
    assert (outcome.parent.parent / "spec.json").is_file()  # what exactly was trained


@pytest.mark.slow
def test_a_runner_without_the_recipe_reports_why_and_no_retry(tmp_path: Path) -> None:
    code, outcome = _run_attempt(tmp_path, "not-installed", {})
    report = RunnerReport.read(outcome)
    assert code == 1 and report is not None and report.error is not None
    assert (report.error["code"], report.error["retryable"]) == ("unknown_recipe", False)
    assert "no recipe 'not-installed'" in report.error["message"]


def test_the_attempts_error_is_the_rank_whose_code_raised_not_a_survivor(tmp_path: Path) -> None:
    """Rank 1's recipe raised; rank 0's collective broke when rank 1 went away and rank 0
    reported first: the attempt's failure is rank 1's own. With only the broken
    collective reported (rank 1 was killed from outside), it is not the job's own."""
    from workers.ranks.strategies import RanksFailed
    from workers.runner.main import _error

    files = JobFiles.of(tmp_path, 5)
    broken = RuntimeError("[gloo/transport/tcp/pair.cc:537] Read error: Connection reset by peer")
    ended = RanksFailed("rank 0 exited with 1; rank 1 exited with 1")
    files.rank_error(1, 0).parent.mkdir(parents=True)
    files.rank_error(1, 0).write_text(json.dumps(describe(broken, 0)))
    files.rank_error(1, 1).write_text(json.dumps(describe(ValueError("bad column"), 1)))
    error = _error(ended, files, 1)
    assert (error["rank"], error["message"], error["own"]) == (1, "bad column", True)
    files.rank_error(1, 1).unlink()
    error = _error(RanksFailed("rank 1 killed by SIGKILL"), files, 1)
    assert (error["rank"], error["own"]) == (0, False)
