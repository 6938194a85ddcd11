"""The rules of a job spec, each in one place.

What ``auto`` resolves to, how many processes a job runs and with how many threads,
which jobs a worker can serve, and what each strategy needs. The API's check, the
claim's filter, the supervisor and the runner all ask here, so they cannot disagree.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable
from typing import Any

from service import pip_lines
from service.errors import SpecInvalid
from service.models import Accelerator, JobCreate, JobLike, Strategy

# What a process's CUDA context holds on its GPU beside its allocator's memory (a few
# hundred MiB with lazy module loading), counted with each share of a GPU
# (gpu_memory_gb): a share caps the allocator, and the context comes on top.
CUDA_CONTEXT_GB = 0.5


def largest_share_gb(devices: list[dict[str, Any]]) -> float:
    """The most GiB a job asking for part of a GPU could have on one of these (a worker's
    ``devices``): the largest, idle, less one CUDA context. 0 with none."""
    return max((d["memory_mb"] / 1024 - CUDA_CONTEXT_GB for d in devices), default=0.0)


def unknown_field(name: str, known: Iterable[str]) -> str:
    """Why a field is refused, with the known names close to it: a typo is told its fix."""
    close = difflib.get_close_matches(name, list(known), n=3, cutoff=0.6)
    hint = f"; did you mean {' or '.join(map(repr, close))}?" if close else ""
    return f"unknown field {name!r}{hint}"


def wants(job: JobCreate | JobLike) -> str:
    """What a queued job waits for, in words."""
    if job.nodes > 1:
        return f"{job.nodes} nodes with {job.devices} free device(s) each"
    if job.gpu_memory_gb is not None:
        return f"{job.gpu_memory_gb:g} GiB free on one GPU"
    return f"{job.devices} free device(s)"


def resolve_strategy(strategy: Strategy | str, devices: int) -> Strategy:
    """``auto`` is ddp for more than one device, else single."""
    strategy = Strategy(strategy)
    if strategy != Strategy.auto:
        return strategy
    return Strategy.ddp if devices > 1 else Strategy.single


def resolve_accelerator(accelerator: Accelerator | str, worker: Accelerator | str) -> Accelerator:
    """``auto`` is what the worker has (cuda on a box with GPUs, else cpu)."""
    accelerator = Accelerator(accelerator)
    return Accelerator(worker) if accelerator == Accelerator.auto else accelerator


def world_size(strategy: Strategy | str, devices: int, nodes: int = 1) -> int:
    """Processes a job trains in: one per device (on each of its nodes) for ddp, else one."""
    return devices * nodes if resolve_strategy(strategy, devices) == Strategy.ddp else 1


def threads_per_process(
    slots_held: int, slots_total: int, processes: int, cores: int | None = None
) -> int:
    """Torch threads for each process of a job: its share of the box's cores (those this
    process may run on: a worker pinned to some cores shares those), at least one."""
    cores = cores or len(os.sched_getaffinity(0)) or 1
    return max(1, (cores * slots_held) // (slots_total * max(processes, 1)))


def served_accelerators(worker: Accelerator | str) -> list[Accelerator]:
    """The ``accelerator`` values of jobs a worker with these devices can run."""
    if Accelerator(worker) == Accelerator.cuda:
        return [Accelerator.auto, Accelerator.cpu, Accelerator.cuda]
    return [Accelerator.auto, Accelerator.cpu]


def strategy_problem(
    strategy: Strategy | str, devices: int, accelerator: Accelerator, *, script: bool = False
) -> str | None:
    """Why a strategy cannot run on these devices (resolved accelerator), or None.

    A script's dp is one process holding the job's devices, whatever it does with them
    (DataParallel, or its own mp.spawn), so it runs on CPU slots too."""
    dp = resolve_strategy(strategy, devices) == Strategy.dp and not script
    if dp and devices > 1 and accelerator != Accelerator.cuda:
        return "dp (DataParallel) needs CUDA devices; on CPU use ddp for more than one device"
    return None


# Fields only Trainyard's own training loop reads: a script takes its own arguments (its
# params reach it as JSON in TRAINYARD_PARAMS).
RECIPE_ONLY = ("epochs", "batch_size", "lr", "optimizer", "precision", "checkpoint_every")
# Fields only a script job reads.
SCRIPT_ONLY = ("requirements",)


def is_script(spec: JobCreate | JobLike) -> bool:
    """A script job runs the user's own entrypoint; any other job runs a recipe."""
    return spec.entrypoint is not None


def blob_uses(spec: JobCreate) -> dict[str, str]:
    """The blobs a job uses, by role ("code", "data:<name>") -> digest."""
    uses = {"code": spec.code} if spec.code is not None else {}
    uses.update({f"data:{name}": digest for name, digest in (spec.data or {}).items()})
    return uses


def field_of(role: str) -> tuple[str, ...]:
    """Where in the spec a blob of this role is named: ("code",) or ("data", name)."""
    return ("code",) if role == "code" else ("data", role.removeprefix("data:"))


def check_shape(spec: JobCreate) -> None:
    """Rules between a spec's fields that hold whatever the workers are."""
    if spec.strategy == Strategy.single and spec.devices != 1:
        raise SpecInvalid.at(("devices",), "single trains on exactly one device; use ddp or dp")
    if spec.gpu_memory_gb is not None:
        _check_share(spec)
    if spec.nodes > 1:
        _check_nodes(spec)
    if is_script(spec):
        _check_script(spec)
    else:
        _check_recipe(spec)


def _check_share(spec: JobCreate) -> None:
    """A share is part of one GPU: one device, on CUDA."""
    if spec.devices != 1:
        raise SpecInvalid.at(
            ("devices",),
            "gpu_memory_gb asks for part of one GPU: give devices: 1 (or leave "
            "gpu_memory_gb out to hold whole GPUs)",
        )
    if spec.accelerator == Accelerator.cpu:
        raise SpecInvalid.at(
            ("accelerator",), "gpu_memory_gb is part of a GPU: use cuda or auto, not cpu"
        )


def _check_nodes(spec: JobCreate) -> None:
    """A job across boxes is one DDP world: ddp, with whole devices on every node."""
    if spec.strategy != Strategy.ddp:
        raise SpecInvalid.at(
            ("strategy",),
            "nodes > 1 runs one DDP world across boxes: give strategy: ddp (single and dp "
            "train in one process, on one box)",
        )
    if spec.gpu_memory_gb is not None:
        raise SpecInvalid.at(
            ("gpu_memory_gb",), "a job across boxes holds whole devices on every node"
        )


def _check_script(spec: JobCreate) -> None:
    if spec.recipe is not None:
        raise SpecInvalid.at(
            ("entrypoint",), "a job runs a recipe or a script (entrypoint), not both"
        )
    if spec.code is None:
        raise SpecInvalid.at(
            ("code",),
            "a script job runs in its code package: upload a zip with PUT "
            "/api/v1/blobs/{digest} and give that digest as code",
        )
    defaults = JobCreate.model_fields
    for name in RECIPE_ONLY:
        if getattr(spec, name) != defaults[name].get_default(call_default_factory=True):
            raise SpecInvalid.at(
                (name,),
                f"{name} is a recipe setting; a script job takes its own arguments in entrypoint",
            )
    _check_requirements(spec.requirements or [])


def _check_requirements(lines: list[str]) -> None:
    """Refuse lines that name a path outside the package (pip would read it on the
    worker, and its error would show what it read), each line at fault at once."""
    errors = []
    for index, line in enumerate(lines):
        path = pip_lines.outside(line)
        if path is not None:
            errors.append(
                {
                    "loc": ["body", "requirements", index],
                    "msg": pip_lines.outside_why(line, path),
                    "type": "value_error",
                }
            )
    if errors:
        raise SpecInvalid(errors)


def _check_recipe(spec: JobCreate) -> None:
    if spec.recipe is None:
        raise SpecInvalid.at(
            ("recipe",),
            "give a recipe (GET /api/v1/recipes), or code and entrypoint to run a script",
        )
    # with code, the recipe is one the package defines (its trainyard_recipes.py)
    if spec.data is not None and spec.code is None:
        raise SpecInvalid.at(
            ("data",), "data is for jobs that bring code: a script, or a recipe of its package"
        )
    for name in SCRIPT_ONLY:
        if getattr(spec, name) is not None:
            raise SpecInvalid.at((name,), f"{name} is for script jobs (give code and entrypoint)")
    strategy = resolve_strategy(spec.strategy, spec.devices)
    ranks = world_size(strategy, spec.devices, spec.nodes)
    if strategy == Strategy.ddp and spec.batch_size % ranks:
        each = "devices" if spec.nodes == 1 else "nodes x devices"
        raise SpecInvalid.at(
            ("batch_size",),
            f"ddp gives each of the {ranks} ranks batch_size/{each} samples: "
            f"batch_size must be a multiple of {each} (got {spec.batch_size})",
        )
