"""An example custom recipe: fit y = x³ − x with a small MLP.

Drop a file like this into TRAINYARD_RECIPES_DIR (./recipes in docker-compose.yml);
every worker publishes it to GET /api/v1/recipes when it starts.
"""

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn
from torch.utils.data import TensorDataset

from workers.recipes import Recipe


class CubicParams(BaseModel):
    model_config = ConfigDict(extra="forbid")  # unknown params -> 422 at submit

    hidden: int = Field(32, ge=1, le=4096, description="Hidden layer width.")
    samples: int = Field(2048, ge=16, le=1_000_000, description="Training samples.")


def build_model(p: CubicParams) -> nn.Module:
    return nn.Sequential(nn.Linear(1, p.hidden), nn.Tanh(), nn.Linear(p.hidden, 1))


def build_datasets(p: CubicParams, seed: int) -> tuple[TensorDataset, TensorDataset]:
    g = torch.Generator().manual_seed(seed)  # same seed, same data: on every rank
    x = torch.rand(p.samples + 256, 1, generator=g) * 4 - 2
    y = x**3 - x
    return TensorDataset(x[: p.samples], y[: p.samples]), TensorDataset(
        x[p.samples :], y[p.samples :]
    )


def max_error(out: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    return {"max_abs_error": (out - y).abs().max().item()}


cubic = Recipe(
    name="cubic",
    summary="Fit y = x³ − x on [-2, 2] with a one-hidden-layer MLP.",
    params=CubicParams,
    build_model=build_model,
    build_datasets=build_datasets,
    loss=nn.functional.mse_loss,
    metrics=max_error,
    reports=("max_abs_error",),
)
