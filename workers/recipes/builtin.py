"""Built-in recipes on synthetic data, fixed by the seed (no downloads: GPU boxes are offline)."""

from __future__ import annotations

import torch
from pydantic import BaseModel, ConfigDict, Field, JsonValue
from torch import Tensor, nn
from torch.utils.data import TensorDataset

from service.recipe_memory import MEMORY_KEY
from workers.recipes import Recipe

# What every process holds at least, as float32 values: the data set (train and
# validation, each rank builds all of it) and the weights with their gradients and
# AdamW's two moments. The API refuses at submit what no worker has memory for.
MLP_MEMORY: dict[str, JsonValue] = {
    "bytes_per_value": 4,
    "terms": [
        ["features", "train_samples"],
        ["features", "val_samples"],
        [4, "features", "hidden"],
        [4, "hidden", "hidden", "layers"],
    ],
}


class MLPParams(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={MEMORY_KEY: MLP_MEMORY})

    hidden: int = Field(64, ge=1, le=65536, description="Width of each hidden layer.")
    layers: int = Field(2, ge=1, le=64, description="Number of hidden layers.")
    features: int = Field(16, ge=1, le=65536, description="Input features.")
    train_samples: int = Field(4096, ge=1, le=10_000_000)
    val_samples: int = Field(1024, ge=1, le=10_000_000)


class RegressionParams(MLPParams):
    noise: float = Field(0.1, ge=0, le=10, description="Std of the noise added to targets.")


class ClassifierParams(MLPParams):
    classes: int = Field(4, ge=2, le=1000)
    spread: float = Field(1.5, gt=0, le=100, description="Std of each Gaussian blob.")


def _mlp(features: int, hidden: int, layers: int, out: int) -> nn.Module:
    mods: list[nn.Module] = []
    width = features
    for _ in range(layers):
        mods += [nn.Linear(width, hidden), nn.ReLU()]
        width = hidden
    mods.append(nn.Linear(width, out))
    return nn.Sequential(*mods)


def _regression_model(p: RegressionParams) -> nn.Module:
    return _mlp(p.features, p.hidden, p.layers, 1)


def _regression_data(p: RegressionParams, seed: int) -> tuple[TensorDataset, TensorDataset]:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(p.features, 1, generator=g)
    n = p.train_samples + p.val_samples
    x = torch.randn(n, p.features, generator=g)
    y = torch.sin(x @ w / p.features**0.5) + p.noise * torch.randn(n, 1, generator=g)
    t = p.train_samples
    return TensorDataset(x[:t], y[:t]), TensorDataset(x[t:], y[t:])


def _classifier_model(p: ClassifierParams) -> nn.Module:
    return _mlp(p.features, p.hidden, p.layers, p.classes)


def _classifier_data(p: ClassifierParams, seed: int) -> tuple[TensorDataset, TensorDataset]:
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(p.classes, p.features, generator=g)
    n = p.train_samples + p.val_samples
    labels = torch.randint(0, p.classes, (n,), generator=g)
    x = centers[labels] + p.spread * torch.randn(n, p.features, generator=g)
    t = p.train_samples
    return TensorDataset(x[:t], labels[:t]), TensorDataset(x[t:], labels[t:])


def _accuracy(outputs: Tensor, targets: Tensor) -> dict[str, float]:
    return {"accuracy": (outputs.argmax(dim=1) == targets).float().mean().item()}


RECIPES = [
    Recipe(
        name="mlp-regression",
        summary="MLP regressing sin(x·w/√d) plus noise on synthetic data fixed by the seed.",
        params=RegressionParams,
        build_model=_regression_model,
        build_datasets=_regression_data,
        loss=nn.functional.mse_loss,
    ),
    Recipe(
        name="mlp-classifier",
        summary="MLP classifying synthetic Gaussian blobs; reports validation accuracy.",
        params=ClassifierParams,
        build_model=_classifier_model,
        build_datasets=_classifier_data,
        loss=nn.functional.cross_entropy,
        metrics=_accuracy,
        reports=("accuracy",),
    ),
]
