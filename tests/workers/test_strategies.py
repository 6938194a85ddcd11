"""Same spec + seed => same weights, whatever the strategy (real gloo DDP, 2 ranks)."""

from __future__ import annotations

import queue
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from workers import strategies, training
from workers.recipes import load_recipes
from workers.training import MODEL_FILE, RunSpec, evaluate

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


def test_single_dp_and_ddp_end_with_the_same_weights(tmp_path: Path) -> None:
    results, weights = {}, {}
    for strategy, devices in (("single", 1), ("dp", 1), ("ddp", 2)):
        spec = spec_for(tmp_path, strategy, devices)
        events: queue.SimpleQueue[object] = queue.SimpleQueue()
        results[strategy] = strategies.run(spec, events)
        weights[strategy] = load_file(Path(spec.job_dir) / MODEL_FILE)
        assert not events.empty()  # rank 0 reported progress and metrics
    assert relative_difference(weights["single"], weights["dp"]) < 1e-4
    assert relative_difference(weights["single"], weights["ddp"]) < 1e-4
    # and they learned something (guards against "equal because nothing trained")
    assert results["single"]["val/accuracy"] > 0.5
    for name in ("val/loss", "train/epoch_loss", "val/accuracy"):
        assert results["ddp"][name] == pytest.approx(results["single"][name], rel=1e-4)


def test_saved_model_reproduces_the_reported_val_loss(tmp_path: Path) -> None:
    spec = spec_for(tmp_path, "single", 1, recipe="mlp-regression", params={"train_samples": 256})
    result = strategies.run(spec, queue.SimpleQueue())
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
    strategies.run(whole, queue.SimpleQueue())
    # train 2 of 3 epochs, then "restart" with epochs=3: it resumes from epoch 2's checkpoint
    split = spec_for(tmp_path, "single", 1, job_dir=str(tmp_path / "split"), epochs=2)
    strategies.run(split, queue.SimpleQueue())
    resumed = replace(split, epochs=3)
    strategies.run(resumed, queue.SimpleQueue())
    a = load_file(Path(whole.job_dir) / MODEL_FILE)
    b = load_file(Path(resumed.job_dir) / MODEL_FILE)
    assert relative_difference(a, b) < 1e-6


class StopAtStep:
    """A sink that asks training to stop (as SIGTERM would) once it reports ``step``."""

    def __init__(self, step: int) -> None:
        self.step = step

    def put_nowait(self, item: object) -> None:
        kind, payload = item  # type: ignore[misc]
        if kind == "metric" and payload["step"] >= self.step:
            training.STOP_REQUESTED.set()


def test_preempted_mid_epoch_resumes_at_that_batch_with_the_same_weights(tmp_path: Path) -> None:
    whole = spec_for(tmp_path, "single", 1)
    strategies.run(whole, queue.SimpleQueue())
    split = spec_for(tmp_path, "single", 1, job_dir=str(tmp_path / "split"))
    try:
        with pytest.raises(training.Preempted, match="epoch 2, batch 4"):
            strategies.run(split, StopAtStep(20))  # 16 steps per epoch: stops in epoch 2
    finally:
        training.STOP_REQUESTED.clear()
    (ckpt,) = [p.name for p in (Path(split.job_dir) / "checkpoints").glob("*batch-00000004.pt")]
    result = strategies.run(split, queue.SimpleQueue())
    a = load_file(Path(whole.job_dir) / MODEL_FILE)
    b = load_file(Path(split.job_dir) / MODEL_FILE)
    assert relative_difference(a, b) < 1e-6, ckpt
    assert result["val/loss"] > 0


def test_bf16_trains_under_autocast(tmp_path: Path) -> None:
    # Only bf16 steps run inside an autocast context (fp32 steps skip it: it costs time).
    fp32 = spec_for(tmp_path, "single", 1, job_dir=str(tmp_path / "fp32"))
    bf16 = replace(fp32, precision="bf16", job_dir=str(tmp_path / "bf16"))
    results = {s.precision: strategies.run(s, queue.SimpleQueue()) for s in (fp32, bf16)}
    weights = {s.precision: load_file(Path(s.job_dir) / MODEL_FILE) for s in (fp32, bf16)}
    assert results["bf16"]["val/accuracy"] > 0.5  # it learned
    # bf16 matmuls round differently: had autocast not been on, the weights would be equal
    assert relative_difference(weights["fp32"], weights["bf16"]) > 1e-4
