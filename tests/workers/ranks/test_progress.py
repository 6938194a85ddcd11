"""Rank 0's progress: the speed it reports is the speed it trains at."""

from __future__ import annotations

import math
import time
from dataclasses import replace
from pathlib import Path

import torch
from torch import Tensor, nn
from torch.optim.optimizer import register_optimizer_step_post_hook

from service.models import Accelerator, Optimizer, Precision, Strategy
from service.points import MetricPoint, ProgressPoint
from workers.ranks import strategies
from workers.ranks.training import InProcess, RunSpec
from workers.rate import RATE_WINDOW_S
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
    """Each reported rate against the speed of the very steps it covers, both read from
    the same moments: a loaded box slows some epochs more than others, and a rate over
    other steps (the whole run's average, say) would differ from it by more than any
    bound. What the test tells apart is a rate that counted validation."""
    step_ends: list[list[float]] = [[]]  # per epoch, when each optimizer step returned
    first_step = True

    def slow_first_loss(out: Tensor, y: Tensor) -> Tensor:
        nonlocal first_step
        if first_step and torch.is_grad_enabled():
            # The process's first step pays one-time costs (seen: ~0.5 s on a loaded box):
            # a rate measured from it would read a fraction of the real speed.
            first_step = False
            time.sleep(FIRST_STEP_S)
        return nn.functional.cross_entropy(out, y)

    def slow_metrics(out: Tensor, y: Tensor) -> dict[str, float]:
        time.sleep(VALIDATION_S)
        step_ends.append([])  # the next epoch's steps
        return {}

    def step_ended(*_: object) -> None:
        step_ends[-1].append(time.monotonic())  # the clock rank 0's progress reads

    recipe = replace(load_recipes()["mlp-classifier"], loss=slow_first_loss, metrics=slow_metrics)
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
    params = recipe.params.model_validate(spec.params)
    hook = register_optimizer_step_post_hook(step_ended)
    try:
        strategies.run(spec, InProcess(points), recipe=recipe, params=params)
    finally:
        hook.remove()
    ends = [t for epoch in step_ends for t in epoch]  # ends[k - 1]: step k's end
    assert [len(epoch) for epoch in step_ends if epoch] == [64, 64, 64]
    training_s = sum(epoch[-1] - epoch[0] for epoch in step_ends if epoch)
    assert training_s < RATE_WINDOW_S  # every rate runs from the first step (no window)

    reported = [
        (p.step, p.samples_per_s)
        for p in points.items
        if isinstance(p, ProgressPoint) and p.samples_per_s is not None
    ]
    reported += [
        (p.step, p.value)
        for p in points.items
        if isinstance(p, MetricPoint) and p.name == "train/samples_per_s"
    ]
    assert len(reported) >= 6  # each epoch's end, as progress and as a metric point
    for step, rate in reported:
        # The rate runs from step 1's end to step ``step``'s, on a clock that stops at
        # each epoch's end: the same span, less each pause (validation and the next
        # epoch's first step, which the test cannot split apart).
        until = ends[step - 1]
        gaps = [b - a for e in step_ends for a, b in zip(e, e[1:], strict=False) if b <= until]
        trains_at = BATCH * len(gaps) / sum(gaps)
        with_validation = BATCH * (step - 1) / (until - ends[0])
        assert rate is not None and rate < trains_at * 1.5, (step, rate, trains_at)
        # Nearer the training speed than a rate with validation in it (~15x slower on an
        # idle box, less where load slows the steps; the same before the first one), with
        # room for the epochs' first steps, which only the rate counts.
        midway = math.sqrt(trains_at * with_validation)
        assert rate > 0.8 * midway, (step, rate, trains_at, with_validation)
    last = [p for p in points.items if isinstance(p, ProgressPoint)][-1]
    assert last.step == last.total_steps == 3 * 64 and last.eta_s == 0
