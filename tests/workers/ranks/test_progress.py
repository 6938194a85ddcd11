"""Rank 0's progress: the speed it reports is the speed it trains at."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import torch
from torch import Tensor, nn

from service.models import Accelerator, Optimizer, Precision, Strategy
from service.points import MetricPoint, ProgressPoint
from workers.ranks import strategies
from workers.ranks.training import InProcess, RunSpec
from workers.recipes import load_recipes

BATCH = 32
VALIDATION_S = 0.3  # an epoch's training takes a few tens of ms: validation dwarfs it
FIRST_STEP_S = 0.5  # a slow first step, as warm-up makes it


class Points:
    def __init__(self) -> None:
        self.items: list[MetricPoint | ProgressPoint] = []

    def put_nowait(self, item: MetricPoint | ProgressPoint) -> None:
        self.items.append(item)


def test_samples_per_s_is_the_training_speed_whatever_validation_costs(tmp_path: Path) -> None:
    step_times: list[list[float]] = []  # per epoch, when each training step computed its loss

    def timed_loss(out: Tensor, y: Tensor) -> Tensor:
        if torch.is_grad_enabled():  # a training step (validation runs under no_grad)
            if not step_times[0]:
                # The process's first step pays one-time costs (seen: ~0.5 s on a loaded
                # box): a rate measured from it would read a fraction of the real speed.
                time.sleep(FIRST_STEP_S)
            step_times[-1].append(time.perf_counter())
        return nn.functional.cross_entropy(out, y)

    def slow_metrics(out: Tensor, y: Tensor) -> dict[str, float]:
        time.sleep(VALIDATION_S)
        step_times.append([])  # the next epoch's steps
        return {}

    recipe = replace(load_recipes()["mlp-classifier"], loss=timed_loss, metrics=slow_metrics)
    spec = RunSpec(
        job_id=1,
        recipe=recipe.name,
        params={"train_samples": 2048, "val_samples": 64},
        strategy=Strategy.single,
        accelerator=Accelerator.cpu,
        devices=1,
        epochs=3,
        batch_size=BATCH,
        lr=0.01,
        optimizer=Optimizer.adamw,
        seed=0,
        precision=Precision.fp32,
        checkpoint_every=1,
        job_dir=str(tmp_path),
    )
    points = Points()
    step_times.append([])
    params = recipe.params.model_validate(spec.params)
    strategies.run(spec, InProcess(points), recipe=recipe, params=params)

    # The training speed, measured here: the time from one step to the next in an epoch.
    gaps = [b - a for epoch in step_times for a, b in zip(epoch, epoch[1:], strict=False)]
    assert len(gaps) == 3 * (64 - 1)
    trains_at = BATCH * len(gaps) / sum(gaps)

    progress = [p for p in points.items if isinstance(p, ProgressPoint)]
    rates = [p.samples_per_s for p in progress if p.samples_per_s is not None]
    rates += [p.value for p in points.items if getattr(p, "name", "") == "train/samples_per_s"]
    assert len(rates) >= 6  # each epoch's end, as progress and as a metric point
    # Counting a validation in would divide the rate by ~15 (0.3 s of sleep per ~20 ms
    # epoch); the reported rate also spans each epoch's first step, which the gaps do not.
    for rate in rates:
        assert trains_at / 2 < rate < trains_at * 2, (rate, trains_at)
    last = progress[-1]
    assert last.step == last.total_steps == 3 * 64 and last.eta_s == 0
