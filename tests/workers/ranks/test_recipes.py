"""Recipes load from the built-ins and from a directory of .py files."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from workers.recipes import SkippedSource, find_recipes, load_recipes

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


def test_the_readme_example_recipe_trains(tmp_path: Path) -> None:
    """The example in docs/recipes.md (recipes/cubic.py) loads and trains."""
    from workers.ranks import strategies
    from workers.ranks.training import RunSpec

    recipes_dir = Path(__file__).resolve().parents[3] / "recipes"
    assert "cubic" in load_recipes(recipes_dir)
    spec = RunSpec(
        job_id=1,
        recipe="cubic",
        params={"samples": 1024},
        strategy="single",
        accelerator="cpu",
        devices=1,
        epochs=30,
        batch_size=32,
        lr=0.01,
        optimizer="adamw",
        seed=0,
        precision="fp32",
        checkpoint_every=30,
        job_dir=str(tmp_path),
        recipes_dir=str(recipes_dir),
    )
    result = strategies.run(spec)
    assert result["val/loss"] < 0.1 and "val/max_abs_error" in result


def test_a_broken_file_or_a_dot_file_is_skipped_and_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A recipe file that fails to import once stopped the worker from starting at all."""
    (tmp_path / "echo.py").write_text(RECIPE)
    (tmp_path / "typo.py").write_text("def broken(:\n")
    (tmp_path / "raises.py").write_text("import os\n\nraise RuntimeError('no GPU driver')\n")
    (tmp_path / ".echo.py").write_text("this is an editor's backup, not python")
    (tmp_path / ".#echo.py").symlink_to("user@host.1234")  # emacs's lock: a dangling link
    with caplog.at_level(logging.WARNING):
        found = find_recipes(tmp_path)
    assert "echo" in found.recipes and "mlp-regression" in found.recipes
    assert found.skipped == [
        SkippedSource(str(tmp_path / "raises.py"), "RuntimeError: no GPU driver (line 3)"),
        SkippedSource(str(tmp_path / "typo.py"), "SyntaxError: invalid syntax (line 1)"),
    ]
    assert "raises.py: RuntimeError: no GPU driver" in caplog.text and "typo.py" in caplog.text
    assert ".echo.py" not in caplog.text
    assert load_recipes(tmp_path).keys() == found.recipes.keys()
