"""The network, in a module of its own: trainyard_recipes.py imports it like any sibling."""

from torch import nn


def digits_mlp(hidden: int) -> nn.Module:
    return nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))
