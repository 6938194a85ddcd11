"""A recipe that reports what the job's code sees of its environment, then waits (while a
test looks at the job's processes) until a file appears."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn
from torch.utils.data import TensorDataset

from workers.recipes import Recipe

POLL_S = 0.05


class ProbeParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    report_dir: str = Field(description="Each process leaves what it saw here, one file.")
    release_file: str = Field(description="The first step waits until this file exists.")
    wait_s: float = Field(120.0, gt=0, le=600, description="Longest wait for the file.")


_HOLD: dict[str, str | float] = {}


def _datasets(p: ProbeParams, seed: int) -> tuple[TensorDataset, TensorDataset]:
    """Runs in each rank, after the process group is up: leave what this process sees."""
    seen = {
        "pid": os.getpid(),
        "environ": dict(os.environ),
        "proc_environ": Path("/proc/self/environ").read_bytes().decode(errors="replace"),
    }
    report = Path(p.report_dir) / f"pid-{os.getpid()}.json"
    tmp = report.with_suffix(".tmp")
    tmp.write_text(json.dumps(seen))
    tmp.replace(report)
    _HOLD.update(file=p.release_file, deadline=time.monotonic() + p.wait_s)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(128, 4, generator=g)
    y = x.sum(dim=1, keepdim=True)
    return TensorDataset(x, y), TensorDataset(x[:32], y[:32])


def _loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    if _HOLD:  # the first step: wait for the test to look
        release, deadline = Path(str(_HOLD["file"])), float(_HOLD["deadline"])
        while not release.exists() and time.monotonic() < deadline:
            time.sleep(POLL_S)
        _HOLD.clear()
    return nn.functional.mse_loss(out, y)


probe = Recipe(
    name="probe",
    summary="Reports its processes' environment; holds its first step until released.",
    params=ProbeParams,
    build_model=lambda p: nn.Linear(4, 1),
    build_datasets=_datasets,
    loss=_loss,
)
