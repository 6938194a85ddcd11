"""The training loop every strategy shares: one Trainer per rank, the same steps for all.

Split as pytorch/examples' ddp-tutorial-series Trainer splits it: ``_run_batch`` (one
optimizer step), ``_run_epoch`` (the epoch's batches, and the stop check), ``train``
(the epochs, with rank 0's epoch-end work: metrics, validation, checkpoint, weights).
How the model is wrapped (DDP, DataParallel) is the strategy's choice, passed in as
``wrap``. Side effects (points, checkpoints, the final model) happen on rank 0 only.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import torch
import torch.distributed as dist
from pydantic import BaseModel
from torch import nn
from torch.utils.data import DistributedSampler

from service.models import Optimizer, Precision
from workers.ranks.training import checkpoint
from workers.ranks.training.checkpoint import Position
from workers.ranks.training.data import ResumableSampler, batches
from workers.ranks.training.progress import TRAIN_LOSS_EVERY_STEPS, Progress, Sink
from workers.ranks.training.spec import RunSpec
from workers.recipes import Recipe
from workers.stopping import STOP_REQUESTED, Preempted

# Batch size for the validation pass (validation runs on rank 0, unsharded, in fp32).
VAL_BATCH_SIZE = 1024
# DDP ranks agree on "stop now?" every this many steps (one tiny all-reduce each time).
STOP_CHECK_EVERY_STEPS = 20


class Trainer:
    """One rank's model, optimizer, data and position; rank 0 also reports.

    ``Trainer(...).train()`` trains (or resumes) the job on this rank and returns the
    final metrics on rank 0. It raises Preempted when asked to stop, after rank 0 saved a
    checkpoint of the exact position (epoch, batch): the next attempt continues there.
    """

    def __init__(
        self,
        rank: int,
        spec: RunSpec,
        recipe: Recipe,
        params: BaseModel,
        device: torch.device,
        sink: Sink | None,
        wrap: Callable[[nn.Module], nn.Module],
    ) -> None:
        self.rank, self.spec, self.recipe, self.device = rank, spec, recipe, device
        self.distributed = spec.plan.distributed
        train_set, self.val_set = recipe.build_datasets(params, spec.seed)

        torch.manual_seed(spec.seed)  # the same initial weights on every rank and strategy
        self.model = recipe.build_model(params).to(device)
        self.optimizer = _optimizer(spec, self.model)
        self.at, unconfirmed = checkpoint.resume(spec, self.model, self.optimizer, device, rank)
        self.wrapped = wrap(self.model)  # after resume: the state loads into the module

        world = spec.world_size
        self.local_batch = spec.batch_size // world
        self.sampler = ResumableSampler(
            DistributedSampler(
                train_set, num_replicas=world, rank=rank, shuffle=True, seed=spec.seed
            )
        )
        self.loader = batches(train_set, self.local_batch, self.sampler)
        total_steps = math.ceil(len(self.sampler.inner) / self.local_batch) * spec.epochs
        self.progress = (
            Progress(sink, spec, total_steps, self.at.step, unconfirmed) if rank == 0 else None
        )
        self.bf16 = spec.precision == Precision.bf16
        self.on_cpu = device.type == "cpu"
        self.step = self.at.step

    def train(self) -> dict[str, float]:
        """Every epoch left; rank 0 saves the final weights and returns the last metrics."""
        result: dict[str, float] = {}
        for epoch in range(self.at.epoch, self.spec.epochs):
            totals = self._run_epoch(epoch)
            if self.progress is not None:
                result = self._end_epoch(epoch + 1, totals, self.progress)
        if self.rank == 0:
            checkpoint.save_model(self.spec, self.model)
            if not result:  # resumed after the last epoch's checkpoint: report what it holds
                result = evaluate(self.recipe, self.model, self.val_set, self.device)
        return result

    def _run_batch(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        # Per step only what the step needs: on CPU the batch is already where it goes,
        # and fp32 needs no autocast context. (Microseconds each, with the loss sum's
        # three ops instead of one: ~1% of a small model's step, measured side by side.)
        if not self.on_cpu:
            x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
        with torch.autocast(self.device.type, dtype=torch.bfloat16) if self.bf16 else nullcontext():
            loss = self.recipe.loss(self.wrapped(x), y)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        return loss

    def _run_epoch(self, epoch: int) -> torch.Tensor:
        """The epoch's batches (from where a resumed one stopped); (loss sum, samples)."""
        at, device, progress, run_batch = self.at, self.device, self.progress, self._run_batch
        resuming = epoch == at.epoch
        batch = at.batch if resuming else 0
        self.sampler.set_epoch(epoch, skip=batch * self.local_batch)
        self.wrapped.train()
        loss_sum = torch.tensor(
            at.loss_sum if resuming else 0.0, dtype=torch.float64, device=device
        )
        seen = at.seen if resuming else 0
        step = self.step
        if progress is not None:
            progress.resume()
        for x, y in self.loader:
            loss = run_batch(x, y)
            step += 1
            batch += 1
            loss_sum.add_(loss.detach(), alpha=len(x))  # no .item(): no sync per step
            seen += len(x)
            if self.distributed and step % TRAIN_LOSS_EVERY_STEPS == 0:
                loss = _global_loss(loss, len(x))  # every rank, at the steps reported
            if progress is not None:
                progress.step(epoch + 1, step, loss)
            if _should_stop(step, self.distributed, device):
                totals = _global_totals(loss_sum, seen, self.distributed)
                if progress is not None:
                    where = Position(epoch, batch, step, *totals.tolist())
                    self._save(where, progress)
                raise Preempted(f"stopped at epoch {epoch + 1}, batch {batch}, step {step}")
        self.step = step
        if progress is not None:
            progress.pause(step)  # what follows is epoch-end work, not training speed
        return _global_totals(loss_sum, seen, self.distributed)

    def _end_epoch(self, done: int, totals: torch.Tensor, progress: Progress) -> dict[str, float]:
        """Rank 0: the epoch's metrics (with validation), reported; a checkpoint when due."""
        total, count = totals.tolist()
        result = {
            "train/epoch_loss": total / max(count, 1),
            "train/lr": self.optimizer.param_groups[0]["lr"],
        }
        result.update(evaluate(self.recipe, self.model, self.val_set, self.device))
        progress.epoch(done, self.step, result)
        if done % self.spec.checkpoint_every == 0 or done == self.spec.epochs:
            self._save(Position(done, 0, self.step), progress)
        return result

    def _save(self, at: Position, progress: Progress) -> None:
        checkpoint.save(self.spec, self.model, self.optimizer, at, progress.unconfirmed())


def _should_stop(step: int, distributed: bool, device: torch.device) -> bool:
    """Whether to stop now; with DDP, every rank must agree on the same step."""
    if not distributed:
        return STOP_REQUESTED.is_set()
    if step % STOP_CHECK_EVERY_STEPS:
        return False
    flag = torch.tensor(1.0 if STOP_REQUESTED.is_set() else 0.0, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)  # one rank's SIGTERM stops them all
    return bool(flag.item())


def _global_loss(loss: torch.Tensor, samples: int) -> torch.Tensor:
    """The global batch's loss: each rank's mean weighted by its samples. A rank's own
    loss is its part of the batch only (half of it under ddp(2), ~10% off the whole), so
    a curve would not compare with single's; one small all-reduce at a reported step."""
    local = loss.detach().to(torch.float64)
    totals = torch.stack([local * samples, torch.ones_like(local) * samples])
    dist.all_reduce(totals)
    return totals[0] / totals[1]


def _global_totals(loss_sum: torch.Tensor, seen: float, distributed: bool) -> torch.Tensor:
    """(loss sum, samples) over every rank."""
    totals = torch.stack(
        [loss_sum, torch.tensor(float(seen), dtype=torch.float64, device=loss_sum.device)]
    )
    if distributed:
        dist.all_reduce(totals)
    return totals


def evaluate(
    recipe: Recipe, model: nn.Module, val_set: Any, device: torch.device
) -> dict[str, float]:
    """Validation loss (and recipe metrics), per-sample means over the whole set, in fp32."""
    model.eval()
    totals: dict[str, float] = {}
    n = 0
    with torch.no_grad():
        for x, y in batches(val_set, VAL_BATCH_SIZE):
            x, y = x.to(device), y.to(device)
            out = model(x)
            values = {"loss": recipe.loss(out, y).item()}
            if recipe.metrics is not None:
                values.update(recipe.metrics(out, y))
            for k, v in values.items():
                totals[k] = totals.get(k, 0.0) + v * len(x)
            n += len(x)
    model.train()
    return {f"val/{k}": v / max(n, 1) for k, v in totals.items()}


def _optimizer(spec: RunSpec, model: nn.Module) -> torch.optim.Optimizer:
    if spec.optimizer == Optimizer.sgd:
        return torch.optim.SGD(model.parameters(), lr=spec.lr, momentum=0.9)
    return torch.optim.AdamW(model.parameters(), lr=spec.lr)
