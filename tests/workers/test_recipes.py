"""Recipes load from the built-ins and from a directory of .py files."""

from __future__ import annotations

from pathlib import Path

from workers.recipes import load_recipes

RECIPE = """
import torch
from pydantic import BaseModel, ConfigDict
from torch import nn
from torch.utils.data import TensorDataset
from workers.recipes import Recipe


class P(BaseModel):
    model_config = ConfigDict(extra="forbid")
    n: int = 8


def data(p, seed):
    x = torch.randn(p.n, 2, generator=torch.Generator().manual_seed(seed))
    return TensorDataset(x, x), TensorDataset(x, x)


echo = Recipe(name="echo", summary="Learn the identity.", params=P,
              build_model=lambda p: nn.Linear(2, 2), build_datasets=data,
              loss=nn.functional.mse_loss)
"""


def test_builtins_are_always_there() -> None:
    recipes = load_recipes()
    assert {"mlp-regression", "mlp-classifier"} <= set(recipes)
    described = recipes["mlp-classifier"].describe()
    assert described["params_schema"]["properties"]["classes"]["default"] == 4


def test_a_recipe_file_in_the_directory_is_loaded(tmp_path: Path) -> None:
    (tmp_path / "echo.py").write_text(RECIPE)
    (tmp_path / "notes.txt").write_text("not python")
    recipes = load_recipes(tmp_path)
    echo = recipes["echo"]
    params = echo.params.model_validate({"n": 4})
    train, _ = echo.build_datasets(params, 0)
    assert len(train) == 4  # type: ignore[arg-type]
    assert echo.describe()["params_schema"]["additionalProperties"] is False
    before = echo.source_hash()
    (tmp_path / "echo.py").write_text(RECIPE + "\n# changed\n")
    assert load_recipes(tmp_path)["echo"].source_hash() != before
