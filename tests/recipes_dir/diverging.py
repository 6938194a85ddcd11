"""A recipe whose loss is not finite, and whose metrics name themselves too long: the
numbers and names a careless recipe reports, which must reach the database as nulls
and dropped names, never raw."""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn
from torch.utils.data import TensorDataset

from workers.recipes import Recipe

LONG_NAME = "a-metric-name-past-the-column-" * 10  # 300 characters


class DivergingParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    loss: Literal["nan", "inf", "-inf"] = Field("nan", description="What every loss is.")


_LOSS = {"value": float("nan")}  # the loss has no params argument: set with the data


def _model(_p: DivergingParams) -> nn.Module:
    return nn.Linear(4, 1)


def _data(p: DivergingParams, seed: int) -> tuple[TensorDataset, TensorDataset]:
    _LOSS["value"] = float(p.loss)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(128, 4, generator=g)
    return TensorDataset(x, x.sum(dim=1, keepdim=True)), TensorDataset(x[:32], x[:32, :1])


def _loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    # A constant added: the gradients stay finite, the loss is what the params say.
    return nn.functional.mse_loss(out, y) + _LOSS["value"]


def _metrics(out: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    return {"overflow": float("inf"), LONG_NAME: 1.0, "ok": 0.5}


diverging = Recipe(
    name="diverging",
    summary="A loss that is NaN or infinite, and a metric whose name is too long.",
    params=DivergingParams,
    build_model=_model,
    build_datasets=_data,
    loss=_loss,
    metrics=_metrics,
)
