"""Same spec + seed => same weights, whatever the strategy (real gloo DDP, 2 ranks)."""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from service.points import MetricPoint, ProgressPoint
from tests.gpu.cuda import accelerators, gpu_uuids, in_fresh_process, needs_cuda
from workers.jobfiles import MODEL_FILE
from workers.ranks import strategies, training
from workers.ranks.training import InProcess, RunSpec, checkpoint, evaluate
from workers.recipes import load_recipes

pytestmark = pytest.mark.slow


def spec_for(tmp_path: Path, strategy: str, devices: int, **kw: object) -> RunSpec:
    base = RunSpec(
        job_id=1,
        recipe="mlp-classifier",
        params={"train_samples": 512, "val_samples": 128},
        strategy=strategy,
        accelerator="cpu",
        devices=devices,
        epochs=3,
        batch_size=32,
        lr=0.01,
        optimizer="adamw",
        seed=7,
        precision="fp32",
        checkpoint_every=1,
        job_dir=str(tmp_path / f"{strategy}{devices}"),
    )
    return replace(base, **kw)  # type: ignore[arg-type]


def relative_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    flat_a = torch.cat([a[k].flatten() for k in sorted(a)])
    flat_b = torch.cat([b[k].flatten() for k in sorted(b)])
    return float((flat_a - flat_b).norm() / flat_a.norm())


@dataclass(frozen=True)
class PointsFile:
    """Reports that rank 0 opens wherever it runs (a ddp rank too): points as JSON lines."""

    path: Path

    @contextmanager
    def open(self) -> Iterator[PointsFile]:
        yield self

    def put_nowait(self, item: MetricPoint | ProgressPoint) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps({"kind": type(item).__name__, **item.as_dict()}) + "\n")

    def read(self) -> list[dict[str, object]]:
        return [json.loads(line) for line in self.path.read_text().splitlines()]


def trained(specs: list[RunSpec]) -> list[tuple[dict[str, float], set[str]]]:
    """Each spec trained, in a fresh interpreter (on CUDA, as a runner does: this process
    never touches CUDA; see ``tests/gpu/cuda.py``): its result, and the kinds of points rank
    0 reported from where it ran (its own process for ddp)."""
    return in_fresh_process(_train_each, specs)


def _train_each(specs: list[RunSpec]) -> list[tuple[dict[str, float], set[str]]]:
    warnings.simplefilter("error")  # as in the test process (filterwarnings = error)
    done = []
    for spec in specs:
        points = PointsFile(Path(spec.job_dir).with_suffix(".points.jsonl"))
        result = strategies.run(spec, points)
        done.append((result, {str(p["kind"]) for p in points.read()}))
    return done


@pytest.mark.parametrize("accelerator", accelerators())
def test_single_dp_and_ddp_end_with_the_same_weights(tmp_path: Path, accelerator: str) -> None:
    # On CPU: dp on one slot, ddp on two. On CUDA: as many GPUs as the CPU run has slots,
    # where the box has them (ddp with one GPU still runs NCCL and DDP's gradient hooks).
    gpus = min(2, len(gpu_uuids())) if accelerator == "cuda" else 1
    cases = {"single": 1, "dp": gpus, "ddp": 2 if accelerator == "cpu" else gpus}
    specs = {
        strategy: spec_for(tmp_path, strategy, devices, accelerator=accelerator)
        for strategy, devices in cases.items()
    }
    results = {}
    for strategy, (result, kinds) in zip(specs, trained(list(specs.values())), strict=True):
        results[strategy] = result
        # Rank 0 reported progress and metrics from where it ran (its own process for
        # ddp), and the runner got its result back through the result file.
        assert kinds == {"MetricPoint", "ProgressPoint"}, strategy
    weights = {s: load_file(Path(spec.job_dir) / MODEL_FILE) for s, spec in specs.items()}
    assert relative_difference(weights["single"], weights["dp"]) < 1e-4
    assert relative_difference(weights["single"], weights["ddp"]) < 1e-4
    # and they learned something (guards against "equal because nothing trained")
    assert results["single"]["val/accuracy"] > 0.5
    for name in ("val/loss", "train/epoch_loss", "val/accuracy"):
        assert results["ddp"][name] == pytest.approx(results["single"][name], rel=1e-4)


@needs_cuda
def test_cpu_jobs_on_a_gpu_box_train_on_the_cpu(tmp_path: Path) -> None:
    """A worker with GPUs runs cpu jobs too, its runner seeing the GPUs the job holds: dp
    must not take one (DataParallel would move the module to it)."""
    single, dp = (spec_for(tmp_path, s, 1) for s in ("single", "dp"))
    (single_result, _), (dp_result, _) = trained([single, dp])
    weights = [load_file(Path(s.job_dir) / MODEL_FILE) for s in (single, dp)]
    assert relative_difference(*weights) < 1e-6  # the same CPU arithmetic
    assert dp_result["val/loss"] == pytest.approx(single_result["val/loss"], rel=1e-6)


def test_saved_model_reproduces_the_reported_val_loss(tmp_path: Path) -> None:
    spec = spec_for(tmp_path, "single", 1, recipe="mlp-regression", params={"train_samples": 256})
    result = strategies.run(spec)
    recipe = load_recipes()["mlp-regression"]
    params = recipe.params.model_validate(spec.params)
    model = recipe.build_model(params)
    model.load_state_dict(load_file(Path(spec.job_dir) / MODEL_FILE))
    _, val = recipe.build_datasets(params, spec.seed)
    assert evaluate(recipe, model, val, torch.device("cpu"))["val/loss"] == pytest.approx(
        result["val/loss"], rel=1e-6
    )


def test_resume_from_checkpoint_ends_with_the_same_weights(tmp_path: Path) -> None:
    whole = spec_for(tmp_path, "single", 1)
    strategies.run(whole)
    # train 2 of 3 epochs, then "restart" with epochs=3: it resumes from epoch 2's checkpoint
    split = spec_for(tmp_path, "single", 1, job_dir=str(tmp_path / "split"), epochs=2)
    strategies.run(split)
    resumed = replace(split, epochs=3)
    strategies.run(resumed)
    a = load_file(Path(whole.job_dir) / MODEL_FILE)
    b = load_file(Path(resumed.job_dir) / MODEL_FILE)
    assert relative_difference(a, b) < 1e-6


class StopAtStep:
    """A sink that asks training to stop (as SIGTERM would) once it reports ``step``."""

    def __init__(self, step: int) -> None:
        self.step = step

    def put_nowait(self, item: MetricPoint | ProgressPoint) -> None:
        if isinstance(item, MetricPoint) and item.step >= self.step:
            training.STOP_REQUESTED.set()


def test_preempted_mid_epoch_resumes_at_that_batch_with_the_same_weights(tmp_path: Path) -> None:
    whole = spec_for(tmp_path, "single", 1)
    strategies.run(whole)
    split = spec_for(tmp_path, "single", 1, job_dir=str(tmp_path / "split"))
    try:
        with pytest.raises(training.Preempted, match="epoch 2, batch 4"):
            strategies.run(split, InProcess(StopAtStep(20)))  # 16 steps per epoch: stops in epoch 2
    finally:
        training.STOP_REQUESTED.clear()
    (ckpt,) = [p.name for p in (Path(split.job_dir) / "checkpoints").glob("*batch-00000004.pt")]
    result = strategies.run(split)
    a = load_file(Path(whole.job_dir) / MODEL_FILE)
    b = load_file(Path(split.job_dir) / MODEL_FILE)
    assert relative_difference(a, b) < 1e-6, ckpt
    assert result["val/loss"] > 0


@pytest.mark.parametrize("accelerator", accelerators())
def test_bf16_trains_under_autocast(tmp_path: Path, accelerator: str) -> None:
    # Only bf16 steps run inside an autocast context (fp32 steps skip it: it costs time).
    fp32 = spec_for(tmp_path, "single", 1, job_dir=str(tmp_path / "fp32"), accelerator=accelerator)
    bf16 = replace(fp32, precision="bf16", job_dir=str(tmp_path / "bf16"))
    (fp32_result, _), (bf16_result, _) = trained([fp32, bf16])
    weights = {s.precision: load_file(Path(s.job_dir) / MODEL_FILE) for s in (fp32, bf16)}
    assert bf16_result["val/accuracy"] > 0.5  # it learned
    assert fp32_result["val/accuracy"] > 0.5
    # bf16 matmuls round differently: had autocast not been on, the weights would be equal
    assert relative_difference(weights["fp32"], weights["bf16"]) > 1e-4


def test_a_checkpoint_keeps_unconfirmed_points_and_resume_rebuilds_them(tmp_path: Path) -> None:
    spec = spec_for(tmp_path, "single", 1, epochs=1)
    strategies.run(spec)  # nothing confirms: every point is unconfirmed
    (path,) = (Path(spec.job_dir) / "checkpoints").glob("*.pt")
    state = torch.load(path, weights_only=True)  # plain values only: enums as strings too
    assert state["spec"]["strategy"] == "single" and type(state["spec"]["strategy"]) is str
    assert state["metrics"] and all(type(p) is dict for p in state["metrics"])
    recipe, params = strategies.load(spec)
    model = recipe.build_model(params)
    at, points = checkpoint.resume(
        spec, model, torch.optim.AdamW(model.parameters()), torch.device("cpu"), 0
    )
    assert (at.epoch, at.batch, at.step) == (1, 0, 16)
    assert points == [MetricPoint(**p) for p in state["metrics"]]
    assert [p.name for p in points][:1] == ["train/loss"] and points[0].step == 10
