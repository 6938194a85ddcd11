"""The reproducibility record of an attempt: what exactly ran, where, and with what."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import platform
from typing import Any

import torch

from service.jobspec import resolve_strategy
from service.models import Accelerator, Job
from workers import gpu
from workers.jobfiles import JobFiles, write_atomic
from workers.ranks.training import RunSpec
from workers.recipes import Recipe


def record(spec: RunSpec, recipe: Recipe, *, worker_id: str | None) -> dict[str, Any]:
    """Resolved spec and seed, software versions, hardware, host, worker, packages, recipe."""
    return {
        "spec": {
            k: v
            for k, v in spec.as_dict().items()
            if k not in ("job_dir", "recipes_dir", "package")
        },
        "seed": spec.seed,
        **machine(spec.accelerator, worker_id=worker_id),
        "recipe": recipe.name,
        "recipe_source_sha256": recipe.source_hash(),
    }


def script_record(
    job: Job, attempt: int, *, accelerator: str, threads: int, python: str
) -> dict[str, Any]:
    """A script job's record: what it ran with (code, entrypoint, data, requirements, the
    interpreter), beside the machine."""
    return {
        "spec": {
            "strategy": resolve_strategy(job.strategy, job.devices),
            "accelerator": accelerator,
            "devices": job.devices,
            "code": job.code,
            "entrypoint": job.entrypoint,
            "data": job.data,
            "requirements": job.requirements,
            "threads": threads,
            "attempt": attempt,
        },
        "seed": job.seed,
        "python_executable": python,
        **machine(accelerator, worker_id=job.worker_id),
    }


def machine(accelerator: Accelerator | str, *, worker_id: str | None) -> dict[str, Any]:
    """Software versions, hardware, host, worker and installed packages."""
    cuda = accelerator == Accelerator.cuda
    # The physical ids the supervisor handed this runner (workers.supervisor.devices.gpu_devices).
    devices = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d]
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        # Library versions only: nothing here may initialise CUDA, or the ranks forked
        # after this could not use it.
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "nccl": _nccl_version() if cuda else None,
        "gpus": gpu.describe(devices) if cuda else None,
        "hostname": platform.node(),
        "worker_id": worker_id,
        "packages_sha256": packages_hash(),
    }


def _nccl_version() -> str | None:
    """NCCL's version, where this build of torch has NCCL (not ROCm's or a CPU build)."""
    if not torch.distributed.is_nccl_available():
        return None
    return ".".join(map(str, torch.cuda.nccl.version()))


def write_spec(files: JobFiles, record: dict[str, Any]) -> None:
    """The resolved spec and its environment as an artifact: what exactly was trained."""
    # The spec's fields at the top level (what a rerun needs), the environment beside them.
    text = json.dumps({**record["spec"], "environment": record}, indent=2, sort_keys=True)
    write_atomic(files.spec, text)


def packages_hash() -> str:
    """sha256 of the sorted name==version list of every installed distribution."""
    pins = sorted(f"{d.metadata['Name']}=={d.version}" for d in importlib.metadata.distributions())
    return hashlib.sha256("\n".join(pins).encode()).hexdigest()
