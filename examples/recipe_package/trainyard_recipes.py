"""A recipe in your own package: Trainyard's training loop runs your model and data, so the
job gets what a built-in recipe gets (the same weights under single, dp and ddp, exact
resume from a checkpoint, progress, metrics).

Submit it with the package as ``code`` and the data file it reads:

    {"recipe": "digits-mlp", "code": "sha256:...", "data": {"digits.npz": "sha256:..."},
     "params": {"hidden": 64}, "strategy": "ddp", "devices": 2}

The worker imports this module (the package's root is on sys.path, so ``model`` is found)
and uses every ``Recipe`` it defines at module level. Params are validated when a worker
claims the job: a bad one fails the job at once with reason ``bad_params``.
"""

import os

import numpy as np
import torch
from model import digits_mlp
from pydantic import BaseModel, ConfigDict, Field
from torch import Tensor, nn
from torch.utils.data import TensorDataset

from workers.recipes import Recipe


class DigitsParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    hidden: int = Field(64, ge=1, le=4096, description="Width of the hidden layer.")
    val_fraction: float = Field(0.2, gt=0, lt=1)


def build_datasets(p: DigitsParams, seed: int) -> tuple[TensorDataset, TensorDataset]:
    data = np.load(os.path.join(os.environ["TRAINYARD_INPUT_DIR"], "digits.npz"))
    x = torch.from_numpy(data["images"]).flatten(1)
    y = torch.from_numpy(data["target"]).long()
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    # 1797 digits: 359 for validation, 1438 to train (even, so every ddp rank of 2 gets
    # the same share; DistributedSampler pads an odd count with a repeated sample)
    cut = len(y) - int(len(y) * p.val_fraction)
    train, val = order[:cut], order[cut:]
    return TensorDataset(x[train], y[train]), TensorDataset(x[val], y[val])


def accuracy(outputs: Tensor, targets: Tensor) -> dict[str, float]:
    return {"accuracy": (outputs.argmax(dim=1) == targets).float().mean().item()}


DIGITS = Recipe(
    name="digits-mlp",
    summary="An MLP on scikit-learn's 8x8 handwritten digits (digits.npz as a data file).",
    params=DigitsParams,
    build_model=lambda p: digits_mlp(p.hidden),
    build_datasets=build_datasets,
    loss=nn.functional.cross_entropy,
    metrics=accuracy,
    reports=("accuracy",),
)
