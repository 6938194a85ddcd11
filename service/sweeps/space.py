"""A sweep's space: which job fields its parameters name, what values they take, and the
job spec of one trial. Everything about a sweep that can be refused at submit is here
(the samplers and pruners are ``service.sweeps.search``'s).

A parameter names a field of the job spec (``lr``, ``batch_size``, ``epochs`` …) or a key
of its params (``params.hidden``). A script job reads its trial's values itself: each
``{name}`` in its entrypoint is replaced by the value, and every value is in its params,
which reach it as JSON in ``TRAINYARD_PARAMS``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from typing import Any

from pydantic import ValidationError

from service.errors import SpecInvalid
from service.jobspec import RECIPE_ONLY, is_script
from service.models import JobCreate
from service.sweeps.models import (
    MAX_TRIALS,
    Categorical,
    FloatRange,
    HyperbandPruner,
    IntRange,
    Parameter,
    Resource,
    Search,
    SweepCreate,
)

# Job fields a sweep may not set: what the job is and what it reads, not how it trains.
NOT_SWEPT = frozenset({"name", "recipe", "code", "entrypoint", "data", "requirements", "params"})
SWEEPABLE = frozenset(JobCreate.model_fields) - NOT_SWEPT
PARAMS = "params."
# A grid this large is checked point by point at submit; a larger one by its corners.
CHECK_EVERY_POINT_UP_TO = 1_000
# Decimal places a float grid's points are rounded to (0.1 + 0.2 is 0.3 on the grid).
GRID_DIGITS = 12
# The most points a stepped float range may have (Optuna counts them in decimals).
MAX_STEPS = 10**9

SpecCheck = Callable[[JobCreate], object]  # raises SpecInvalid for a spec it refuses


def check(sweep: SweepCreate, check_spec: SpecCheck, metrics: list[str] | None) -> int:
    """Refuse a space that cannot run (422 naming the parameter, or the field); returns
    how many trials it will start. ``check_spec``: the catalog's check of a job spec;
    ``metrics``: what the job's recipe reports (None: not known)."""
    job = sweep.job
    for name, parameter in sweep.parameters.items():
        _check_name(job, name)
        _check_range(name, parameter)
    size = grid_size(sweep) if sweep.search == Search.grid else None
    trials = _check_trials(sweep, size)
    _check_metric(sweep.metric, metrics)
    _check_pruner(sweep)
    if size is not None and size <= CHECK_EVERY_POINT_UP_TO:
        for values in grid_points(sweep):
            _check_values(job, values, check_spec, at=None)
    else:  # each parameter's extremes, the others as the job has them
        for name, parameter in sweep.parameters.items():
            for value in _probes(parameter):
                _check_values(job, {name: value}, check_spec, at=name)
    return trials


def trial_spec(sweep: SweepCreate, values: dict[str, Any], number: int) -> JobCreate:
    """The job spec of trial ``number``: the template with ``values`` in it."""
    data = sweep.job.model_dump()
    script = is_script(sweep.job)
    params = dict(data["params"])
    for name, value in values.items():
        if name.startswith(PARAMS):
            params[name.removeprefix(PARAMS)] = value
        elif name in SWEEPABLE and not (script and name in RECIPE_ONLY):
            data[name] = value
        if script:  # every value in TRAINYARD_PARAMS, a field's too
            params[name.removeprefix(PARAMS)] = value
    if script:
        data["entrypoint"] = [_substitute(arg, values) for arg in data["entrypoint"]]
    data["params"] = params
    label = sweep.name or "sweep"
    data["name"] = f"{label[:90]} #{number}"
    return JobCreate.model_validate(data)


def grid_size(sweep: SweepCreate) -> int:
    """How many points the grid has (every parameter needs values or a step), counted
    without listing them: a range of a billion steps is refused, not built."""
    return math.prod(_axis_size(name, p) for name, p in sweep.parameters.items())


def grid_values(name: str, parameter: Parameter) -> list[Any]:
    """A parameter's points on the grid, in order (at most MAX_TRIALS of them)."""
    count = _axis_size(name, parameter)
    if count > MAX_TRIALS:
        raise _at(name, f"{count} points on the grid; a grid has at most {MAX_TRIALS}")
    if isinstance(parameter, Categorical):
        return list(parameter.values)
    if isinstance(parameter, IntRange):
        return list(range(parameter.low, parameter.high + 1, parameter.step))
    assert parameter.step is not None
    return [round(parameter.low + i * parameter.step, GRID_DIGITS) for i in range(count)]


def _axis_size(name: str, parameter: Parameter) -> int:
    if isinstance(parameter, Categorical):
        return len(parameter.values)
    if isinstance(parameter, IntRange):
        if parameter.log:
            raise _at(name, "a grid takes every step of a range: give no log for an int")
        return (parameter.high - parameter.low) // parameter.step + 1
    if parameter.step is None:
        raise _at(name, "a grid needs the points of a float range: give a step, or values")
    return round((parameter.high - parameter.low) / parameter.step) + 1


def grid_points(sweep: SweepCreate) -> Iterator[dict[str, Any]]:
    """Every point of the grid."""
    names = list(sweep.parameters)
    axes = [grid_values(name, sweep.parameters[name]) for name in names]

    def points(i: int, point: dict[str, Any]) -> Iterator[dict[str, Any]]:
        if i == len(names):
            yield dict(point)
            return
        for value in axes[i]:
            point[names[i]] = value
            yield from points(i + 1, point)

    return points(0, {})


def _check_name(job: JobCreate, name: str) -> None:
    if name.startswith(PARAMS):
        return  # the params' keys are the recipe's to check (its JSON Schema), with values
    if is_script(job):
        placeholder = "{" + name + "}"
        if any(placeholder in arg for arg in job.entrypoint or []):
            return
        if name in SWEEPABLE and name not in RECIPE_ONLY:
            return
        raise _at(
            name,
            f"not a field a script job takes, nor {placeholder} in its entrypoint: put "
            f"{placeholder} where the script reads it, or name params.{name} to find it "
            "in TRAINYARD_PARAMS only",
        )
    if name not in SWEEPABLE:
        fields = ", ".join(sorted(SWEEPABLE - {"priority", "preemptible"}))
        why = "is what the job is, not a setting to search" if name in NOT_SWEPT else "is not"
        raise _at(name, f"{name} {why} a field of the job; sweep one of {fields}, or params.X")


def _check_range(name: str, p: Parameter) -> None:
    if isinstance(p, Categorical):
        if len(set(map(json.dumps, p.values))) != len(p.values):
            raise _at(name, "values repeat: each value once")
        return
    if p.low > p.high:
        raise _at(name, f"an empty range: low ({p.low}) is above high ({p.high})")
    if not math.isfinite(p.high - p.low):
        raise _at(name, "a range wider than a float can hold")
    if p.log and p.low <= 0:
        raise _at(name, f"log scale needs low > 0 (got {p.low})")
    if isinstance(p, IntRange):
        if p.log and p.step != 1:
            raise _at(name, "log scale takes step 1 for an int")
        if (p.high - p.low) % p.step:
            raise _at(name, f"high - low ({p.high - p.low}) is not a multiple of step ({p.step})")
    elif p.step is not None:
        if p.log:
            raise _at(name, "a float range takes log or step, not both")
        count = (p.high - p.low) / p.step
        if not math.isfinite(count) or count > MAX_STEPS:
            raise _at(name, f"a step this small leaves more than {MAX_STEPS} points: give none")
        if abs(count - round(count)) > 1e-9 * max(1.0, count):
            raise _at(name, f"high - low ({p.high - p.low}) is not a multiple of step ({p.step})")


def _check_trials(sweep: SweepCreate, size: int | None) -> int:
    if size is not None and size > MAX_TRIALS:
        raise SpecInvalid.at(("parameters",), f"the grid has {size} points; at most {MAX_TRIALS}")
    if size is None:
        if sweep.max_trials is None:
            raise SpecInvalid.at(
                ("max_trials",), f"a {sweep.search} search needs a number of trials"
            )
        return sweep.max_trials
    if sweep.max_trials is not None and sweep.max_trials < size:
        raise SpecInvalid.at(
            ("max_trials",),
            f"the grid has {size} points; max_trials {sweep.max_trials} would leave "
            f"{size - sweep.max_trials} of them unrun: raise it, or leave it out",
        )
    return size


def _check_metric(metric: str, metrics: list[str] | None) -> None:
    if metrics is not None and metric not in metrics:
        raise SpecInvalid.at(
            ("metric",),
            f"the job's recipe never reports {metric!r}; it reports {', '.join(metrics)}",
        )


def _check_pruner(sweep: SweepCreate) -> None:
    pruner = sweep.pruner
    if not isinstance(pruner, HyperbandPruner):
        return
    if pruner.resource == Resource.step and pruner.max_resource is None:
        raise SpecInvalid.at(
            ("pruner", "max_resource"),
            "counted in steps, Hyperband needs a trial's whole budget: give max_resource",
        )
    if pruner.min_resource > max_resource(sweep):
        raise SpecInvalid.at(
            ("pruner", "min_resource"),
            f"above the trials' whole budget ({max_resource(sweep)}): Hyperband would "
            "have no bracket, and prune nothing",
        )


def max_resource(sweep: SweepCreate) -> int:
    """A trial's whole budget for Hyperband: as given, else the most epochs a trial runs
    (the job's, or the largest a sweep of epochs tries)."""
    pruner = sweep.pruner
    if isinstance(pruner, HyperbandPruner) and pruner.max_resource is not None:
        return pruner.max_resource
    epochs = sweep.parameters.get("epochs")
    if isinstance(epochs, Categorical):
        return max([v for v in epochs.values if isinstance(v, int)], default=sweep.job.epochs)
    if isinstance(epochs, IntRange | FloatRange):
        return int(epochs.high)
    return sweep.job.epochs


def _probes(p: Parameter) -> list[Any]:
    """Values that show whether a parameter's range fits its field: its ends, and a point
    between (one step in, or a third of the way for a continuous float range, which is no
    whole number: an integer field refuses it)."""
    if isinstance(p, Categorical):
        return list(p.values)
    if p.low == p.high:
        return [p.low]
    if p.step is not None:
        return [p.low, p.high, p.low + p.step]
    assert isinstance(p, FloatRange)
    return [p.low, p.high, p.low + (p.high - p.low) / 3]


def _check_values(
    job: JobCreate, values: dict[str, Any], check_spec: SpecCheck, at: str | None
) -> None:
    """The spec with ``values`` passes JobCreate and the catalog; its errors are put at
    the parameter that set the field they are about."""
    probe = SweepCreate.model_construct(job=job, name=None)
    try:
        spec = trial_spec(probe, values, 0)
        check_spec(spec)
    except ValidationError as invalid:
        raise SpecInvalid(
            [_at_parameter(e["loc"], e["msg"], values, at) for e in invalid.errors()]
        ) from None
    except SpecInvalid as refused:
        raise SpecInvalid(
            [_at_parameter(e["loc"][1:], e["msg"], values, at) for e in refused.errors]
        ) from None


def _at_parameter(
    loc: tuple[Any, ...] | list[Any], msg: str, values: dict[str, Any], at: str | None
) -> dict[str, Any]:
    """An error about a trial's spec, at the parameter whose value set that field."""
    path = ".".join(map(str, loc))
    name = at or next(
        (n for n in values if path == n or path.startswith(n + ".") or n == f"params.{path}"),
        next(iter(values)),
    )
    shown = ", ".join(f"{n}={_text(v)}" for n, v in values.items())
    return {
        "loc": ["body", "parameters", name],
        "msg": f"with {shown}, the job is refused: {path}: {msg}",
        "type": "value_error",
    }


def _substitute(arg: str, values: dict[str, Any]) -> str:
    for name, value in values.items():
        arg = arg.replace("{" + name + "}", _text(value))
    return arg


def _text(value: Any) -> str:
    """A value as a script's argument reads it (JSON's words for true, false and null)."""
    return value if isinstance(value, str) else json.dumps(value)


def _at(name: str, msg: str) -> SpecInvalid:
    return SpecInvalid.at(("parameters", name), msg)
