"""The search and the early stopping, by Optuna: a sweep's study, rebuilt from its trials'
rows when a driver takes the sweep, then asked for new trials and told how trials do.

The study lives in memory (``InMemoryStorage``); the truth is the database's (the
``sweep_trial`` rows and the jobs' metric points), so a driver that dies loses nothing:
the next one rebuilds the same study. This module is the only one that imports Optuna
(and numpy with it), and only the sweep driver imports it, when it first drives a sweep:
the API server starts without it.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.trial import FrozenTrial, TrialState, create_trial

from service.sweeps.models import (
    AshaPruner,
    Categorical,
    FloatRange,
    HyperbandPruner,
    IntRange,
    MedianPruner,
    Mode,
    Search,
    SweepCreate,
)
from service.sweeps.space import grid_values, max_resource

optuna.logging.set_verbosity(optuna.logging.WARNING)  # its INFO line per trial is noise here
log = logging.getLogger(__name__)

STATES = {
    "running": TrialState.RUNNING,
    "complete": TrialState.COMPLETE,
    "pruned": TrialState.PRUNED,
    "failed": TrialState.FAIL,
}


@dataclass(frozen=True)
class PastTrial:
    """A trial as the database has it, to rebuild the study with."""

    values: dict[str, Any]
    system_attrs: dict[str, Any]
    state: str  # a TrialState of service.sweeps.models
    value: float | None
    intermediate: dict[int, float]


class _Grid(optuna.samplers.GridSampler):
    """Optuna's grid, without its stop: asked outside ``optimize``, ``Study.stop`` raises.
    The sweep ends the grid itself, once it has started as many trials as it has points."""

    def after_trial(self, *args: Any, **kwargs: Any) -> None:
        pass


class Study:
    """One sweep's Optuna study: ask for a trial's values, report its points, end it."""

    def __init__(self, name: str, spec: SweepCreate, past: Sequence[PastTrial]) -> None:
        self.spec = spec
        self.distributions = _distributions(spec)
        with _quiet():
            self.study = optuna.create_study(
                # Hyperband puts a trial in a bracket by a hash of the study's name and
                # the trial's number: a rebuilt study must have the same name.
                study_name=name,
                direction="minimize" if spec.mode == Mode.min else "maximize",
                sampler=_sampler(spec, 0),
                pruner=_pruner(spec),
            )
            for trial in past:
                self._add(trial)
        # The points already told, by trial number: each is told once.
        self.told: dict[int, set[int]] = {
            number: set(trial.intermediate) for number, trial in enumerate(past)
        }

    def ask(self) -> tuple[int, dict[str, Any], dict[str, Any]]:
        """A new trial: its number, values and what the sampler noted on it."""
        if self.spec.search != Search.grid:
            # Drawn from a seed of its own (the sweep's and its number): a study rebuilt
            # by another driver draws trial n as the first one would have, not trial 0's
            # values again from a sampler started afresh.
            self.study.sampler = _sampler(self.spec, len(self.study.get_trials(deepcopy=False)))
        with _quiet():
            trial = self.study.ask(self.distributions)
        frozen = self._frozen(trial.number)
        self.told[trial.number] = set()
        return trial.number, dict(trial.params), _json_safe(frozen.system_attrs)

    def report(
        self, number: int, points: Iterable[tuple[int, float]], prune_before: int | None
    ) -> tuple[int | None, dict[str, Any] | None]:
        """Tell a trial its new points (resource, value), in order, asking the pruner after
        each (ASHA notes the value at each rung a trial reaches: that is what the others
        are ranked against, a fast trial's too). Returns the first point the pruner gave
        the trial up at, if one is before ``prune_before`` (None: pruning is off for it:
        its job ended, or the point is its last), and the trial's notes if they changed
        (kept with its row, so a rebuilt study knows them)."""
        told = self.told.setdefault(number, set())
        fresh = [(at, value) for at, value in points if at not in told and math.isfinite(value)]
        if not fresh:
            return None, None
        before = dict(self._frozen(number).system_attrs)
        trial = optuna.trial.Trial(self.study, self._frozen(number)._trial_id)
        give_up = None
        with _quiet():
            for at, value in sorted(fresh):
                trial.report(value, at)
                told.add(at)
                judged = trial.should_prune()
                if judged and prune_before is not None and at < prune_before:
                    give_up = at  # the rest of its points would be judged by this one
                    break
        after = self._frozen(number).system_attrs
        return give_up, (_json_safe(after) if after != before else None)

    def end(self, number: int, state: str, value: float | None) -> None:
        """The trial ended: complete with its value, pruned, or failed."""
        if self._frozen(number).state.is_finished():
            return
        with _quiet():
            if state == "complete" and value is not None and math.isfinite(value):
                self.study.tell(number, value)
            elif state == "pruned":
                self.study.tell(number, state=TrialState.PRUNED)
            else:
                self.study.tell(number, state=TrialState.FAIL)

    def _add(self, past: PastTrial) -> None:
        state = STATES[past.state]
        value = past.value if state == TrialState.COMPLETE else None
        if state == TrialState.COMPLETE and (value is None or not math.isfinite(value)):
            state = TrialState.FAIL
        self.study.add_trial(
            create_trial(
                state=state,
                value=value,
                params=past.values,
                distributions={name: self.distributions[name] for name in past.values},
                system_attrs=past.system_attrs,
                intermediate_values={
                    at: v for at, v in past.intermediate.items() if math.isfinite(v)
                },
            )
        )

    def _frozen(self, number: int) -> FrozenTrial:
        return self.study.get_trials(deepcopy=False)[number]


def _distributions(spec: SweepCreate) -> dict[str, BaseDistribution]:
    """Each parameter as Optuna draws it; on a grid, every parameter is its points."""
    out: dict[str, BaseDistribution] = {}
    for name, p in spec.parameters.items():
        if spec.search == Search.grid:
            out[name] = CategoricalDistribution(grid_values(name, p))
        elif isinstance(p, Categorical):
            out[name] = CategoricalDistribution(p.values)
        elif isinstance(p, IntRange):
            out[name] = IntDistribution(p.low, p.high, log=p.log, step=p.step)
        else:
            assert isinstance(p, FloatRange)
            out[name] = FloatDistribution(p.low, p.high, log=p.log, step=p.step)
    return out


def _sampler(spec: SweepCreate, number: int) -> optuna.samplers.BaseSampler:
    """The sampler that draws trial ``number`` (a grid's: every trial's)."""
    if spec.search == Search.grid:
        space = {name: grid_values(name, p) for name, p in spec.parameters.items()}
        return _Grid(space, seed=spec.seed)
    seed = (spec.seed * 1_000_003 + number) % 2**32
    if spec.search == Search.tpe:
        return optuna.samplers.TPESampler(seed=seed)
    return optuna.samplers.RandomSampler(seed=seed)


def _pruner(spec: SweepCreate) -> optuna.pruners.BasePruner:
    p = spec.pruner
    if isinstance(p, AshaPruner):
        return optuna.pruners.SuccessiveHalvingPruner(
            min_resource=p.min_resource,
            reduction_factor=p.reduction_factor,
            min_early_stopping_rate=p.min_early_stopping_rate,
        )
    if isinstance(p, HyperbandPruner):
        return optuna.pruners.HyperbandPruner(
            min_resource=p.min_resource,
            max_resource=max_resource(spec),
            reduction_factor=p.reduction_factor,
        )
    if isinstance(p, MedianPruner):
        return optuna.pruners.MedianPruner(
            n_startup_trials=p.n_startup_trials,
            n_warmup_steps=p.n_warmup_steps,
            interval_steps=p.interval_steps,
        )
    return optuna.pruners.NopPruner()


def _json_safe(attrs: dict[str, Any]) -> dict[str, Any]:
    """The sampler's notes as JSON keeps them (the grid's tuple points become lists)."""
    out: dict[str, Any] = {}
    for key, value in attrs.items():
        if isinstance(value, dict):
            out[key] = {k: list(v) if isinstance(v, tuple) else v for k, v in value.items()}
        else:
            out[key] = list(value) if isinstance(value, tuple) else value
    return out


class _quiet(warnings.catch_warnings):
    """Optuna's warnings (experimental features, a value reported twice) are not the
    user's to see on the API's log; the sweep's own checks stand in for them."""

    def __enter__(self) -> None:
        super().__enter__()
        warnings.simplefilter("ignore")
