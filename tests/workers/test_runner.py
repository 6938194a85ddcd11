"""The runner's spec: one function from a Job to a RunSpec, and the JSON it leaves."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

import pytest

from service.models import Accelerator, Job, Strategy
from service.reasons import ReasonCode
from workers import environment
from workers.errors import NotRetryable, describe
from workers.jobfiles import JobFiles
from workers.recipes import load_recipes
from workers.training import RunSpec, resolve

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
    names = {f.name for f in fields(RunSpec)} - {"job_dir", "recipes_dir", "attempt"}
    again = RunSpec(**{k: written[k] for k in names}, job_dir=spec.job_dir)
    assert again == spec and again.strategy is Strategy.single
