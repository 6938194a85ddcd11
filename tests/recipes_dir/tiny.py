"""Recipes the tests mount as TRAINYARD_RECIPES_DIR, like an operator would."""

from __future__ import annotations

import os
import sys
import time

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn
from torch.utils.data import TensorDataset

from workers.recipes import Recipe


class TinyParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    width: int = Field(8, ge=1, le=1024)
    samples: int = Field(256, ge=2, le=1_000_000)
    sleep_per_step_s: float = Field(0.0, ge=0, le=10, description="Slow each step down.")
    fail: bool = Field(False, description="Print a few lines, then raise.")
    chatty: int = Field(0, ge=0, le=100, description="Lines printed every step.")


def _model(p: TinyParams) -> nn.Module:
    return nn.Sequential(nn.Linear(4, p.width), nn.Tanh(), nn.Linear(p.width, 1))


def _data(p: TinyParams, seed: int) -> tuple[TensorDataset, TensorDataset]:
    if p.fail:
        # a recipe's own output must reach the job's log, crash or not
        print(f"about to fail in pid {os.getpid()}", flush=True)  # noqa: T201
        print("last words on stderr", file=sys.stderr, flush=True)  # noqa: T201
        raise RuntimeError("tiny recipe failed on purpose")
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(p.samples, 4, generator=g)
    y = x.sum(dim=1, keepdim=True)
    return TensorDataset(x, y), TensorDataset(x[:64], y[:64])


def _loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    # the loss has no params argument: _slow_data leaves what it needs in _STEP
    if _STEP["sleep"]:
        time.sleep(_STEP["sleep"])
    for i in range(int(_STEP["chatty"])):
        print(f"step line {i}")  # noqa: T201
    return nn.functional.mse_loss(out, y)


_STEP = {"sleep": 0.0, "chatty": 0}


def _slow_data(p: TinyParams, seed: int) -> tuple[TensorDataset, TensorDataset]:
    _STEP.update(sleep=p.sleep_per_step_s, chatty=p.chatty)
    return _data(p, seed)


tiny = Recipe(
    name="tiny",
    summary="A four-feature linear target; can be slowed down or made to fail.",
    params=TinyParams,
    build_model=_model,
    build_datasets=_slow_data,
    loss=_loss,
)
