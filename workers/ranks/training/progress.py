"""Rank 0's reports while it trains: metric points and throttled progress, as typed points.

The speed it reports (``samples_per_s``, and ``eta_s`` from it) is the speed the job
*trains* at: measured on a clock that stops while the epoch-end work runs (the loss
all-reduce, validation, the checkpoint), over the last few seconds of training steps. A
rate that counted validation would show a fraction of the real speed at every epoch's
end, and an ETA that jumps.
"""

from __future__ import annotations

import logging
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Protocol

import torch

from service.points import MetricPoint, ProgressPoint
from workers.ranks.training.spec import RunSpec
from workers.rate import StepRate

log = logging.getLogger(__name__)
# Rank 0 records the training loss of its batch every this many steps.
TRAIN_LOSS_EVERY_STEPS = 10
# Rank 0 sends progress at most this often (the API promises a refresh every second).
PROGRESS_INTERVAL_S = 0.25
# A rate needs this many steps behind it: over one or two steps it is mostly noise.
RATE_MIN_STEPS = 10


class Sink(Protocol):
    """Where rank 0's points go: a DbReporter (in the same process), or a list in tests."""

    def put_nowait(self, item: MetricPoint | ProgressPoint) -> None: ...


class Reports(Protocol):
    """How rank 0 opens its sink in the process it trains in (picklable, for ddp ranks).

    Closing the context writes what is left: a rank closes it before it exits.
    """

    def open(self) -> AbstractContextManager[Sink]: ...


@dataclass(frozen=True)
class InProcess:
    """Reports to a sink in this very process: where rank 0 trains here (single and dp,
    in tests and benchmarks). A ddp rank 0 has a process of its own and would fill a copy."""

    sink: Sink

    def open(self) -> AbstractContextManager[Sink]:
        return nullcontext(self.sink)


class Progress:
    """Rank 0's progress and metric points, throttled; never waits on the database."""

    def __init__(
        self,
        sink: Sink | None,
        spec: RunSpec,
        total_steps: int,
        step: int,
        unconfirmed: list[MetricPoint],
    ) -> None:
        self.sink = sink
        self.epochs = spec.epochs
        self.batch_size = spec.batch_size
        self.total_steps = total_steps
        self.flushed_marker = spec.files.flushed_marker
        self.loss: float | None = None
        self.steps_per_s: float | None = None
        self.last_sent = time.monotonic()
        # The training clock: monotonic time less every pause. It starts paused, until
        # the first epoch's steps begin (model building and resuming are not training).
        self.paused_s = 0.0
        self.paused_at: float | None = self.last_sent
        # samples_per_s over the training clock. The first mark is made after the first
        # step this process trains: that step pays one-time costs (allocator, kernels'
        # first use) that are not the job's speed, and over a short window it would be
        # most of the time measured.
        self.rate = StepRate(RATE_MIN_STEPS)
        self.unsaved = list(unconfirmed)  # metric points, in step order
        self.refused_names: set[str] = set()  # metric names that cannot be stored
        for point in unconfirmed:  # what the checkpoint had not seen stored: again
            self._send(point)

    def unconfirmed(self) -> list[MetricPoint]:
        """Points the database may not have yet (after the step the reporter confirmed)."""
        try:
            confirmed = int(self.flushed_marker.read_text())
        except (OSError, ValueError):
            confirmed = -1
        self.unsaved = [p for p in self.unsaved if p.step > confirmed]
        return self.unsaved

    def resume(self) -> None:
        """Training steps start (again): the clock runs."""
        if self.paused_at is not None:
            self.paused_s += time.monotonic() - self.paused_at
            self.paused_at = None

    def pause(self, step: int) -> None:
        """The epoch's steps are done: measure up to here, then stop the clock."""
        now = time.monotonic()
        self._measure(now, step)
        self.paused_at = now

    def step(self, epoch: int, step: int, loss: torch.Tensor) -> None:
        """After each training step (kept cheap: one clock read)."""
        if step % TRAIN_LOSS_EVERY_STEPS == 0:
            self.loss = loss.item()
            self._metric("train/loss", step, epoch, self.loss)
        now = time.monotonic()
        if not self.rate.started:
            self.rate.mark(now - self.paused_s, step)
        elif now - self.last_sent >= PROGRESS_INTERVAL_S:
            self._measure(now, step)
            self._progress(epoch, step, now)

    def epoch(self, epochs_done: int, step: int, metrics: dict[str, float]) -> None:
        """An epoch's end (after ``pause``): progress and the epoch's metric points."""
        self._progress(epochs_done, step, time.monotonic())
        if self.steps_per_s is not None:
            metrics = {**metrics, "train/samples_per_s": self.steps_per_s * self.batch_size}
        for name, value in metrics.items():
            self._metric(name, step, epochs_done, value)

    def _measure(self, now: float, step: int) -> None:
        if not self.rate.started:  # no step trained yet
            return
        rate = self.rate.mark(now - self.paused_s, step)
        if rate is not None:
            self.steps_per_s = rate

    def _progress(self, epoch: int, step: int, now: float) -> None:
        self.last_sent = now
        rate = self.steps_per_s
        self._send(
            ProgressPoint(
                epoch=epoch,
                epochs=self.epochs,
                step=step,
                total_steps=self.total_steps,
                loss=self.loss,
                samples_per_s=_rounded(rate * self.batch_size if rate else None),
                eta_s=_rounded((self.total_steps - step) / rate if rate else None),
            )
        )

    def _metric(self, name: str, step: int, epoch: int, value: float) -> None:
        # A value that is not finite is stored as null (the point says so); a name that
        # cannot be stored (a recipe's metrics name their own) is left out, said once.
        try:
            point = MetricPoint(name=name, step=step, epoch=epoch, value=value, time=time.time())
        except ValueError as refused:
            if name not in self.refused_names:
                self.refused_names.add(name)
                log.warning("metric %.120r not recorded: %s", name, refused)
            return
        self.unsaved.append(point)
        self._send(point)

    def _send(self, item: MetricPoint | ProgressPoint) -> None:
        if self.sink is not None:
            self.sink.put_nowait(item)


def _rounded(x: float | None) -> float | None:
    # Not finite stays so here: the ProgressPoint makes it None.
    return round(x, 3) if x is not None else None
