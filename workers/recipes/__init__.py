"""Recipes: model + data + loss, with a pydantic params model.

Found in three places: the built-ins, installed packages' entry points (group
``trainyard.recipes``), and ``.py`` files in ``TRAINYARD_RECIPES_DIR``. A job may also
bring its own: a code package whose root holds ``trainyard_recipes.py``
(``load_package_recipes``).
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import logging
import sys
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from service.packages import RECIPES_MODULE

if TYPE_CHECKING:  # the worker imports this before torch (see workers.supervisor.loop)
    from torch import Tensor, nn
    from torch.utils.data import Dataset

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "trainyard.recipes"
# A skipped source's error as published (and logged): a line, not a traceback.
MAX_ERROR_CHARS = 500


# What the training loop reports for every recipe (workers.ranks.training).
LOOP_METRICS = ("train/loss", "train/epoch_loss", "train/lr", "train/samples_per_s", "val/loss")


@dataclass(frozen=True)
class Recipe:
    """What to train. ``build_datasets`` must give the same data for the same seed."""

    name: str
    summary: str
    params: type[BaseModel]
    build_model: Callable[[Any], nn.Module]
    build_datasets: Callable[[Any, int], tuple[Dataset[Any], Dataset[Any]]]
    loss: Callable[[Tensor, Tensor], Tensor]
    # (outputs, targets) of one validation batch -> per-sample means, e.g. accuracy
    metrics: Callable[[Tensor, Tensor], dict[str, float]] | None = None
    # The names ``metrics`` returns ("accuracy"), reported as val/<name>: a sweep may rank
    # trials by them. None with ``metrics`` set: not said, so a sweep may name any val/.
    reports: tuple[str, ...] | None = None

    def describe(self) -> dict[str, Any]:
        """Name, summary, params JSON schema, source hash and the metrics it reports, as
        workers publish them."""
        return {
            "name": self.name,
            "summary": self.summary,
            "params_schema": self.params.model_json_schema(),
            "source_hash": self.source_hash(),
            "metrics": self.metric_names(),
        }

    def metric_names(self) -> list[str] | None:
        """Every metric the training loop reports for this recipe, or None if its own
        ``metrics`` did not say what it returns."""
        if self.metrics is None:
            return list(LOOP_METRICS)
        if self.reports is None:
            return None
        return [*LOOP_METRICS, *(f"val/{name}" for name in self.reports)]

    def source_hash(self) -> str:
        """sha256 of the source file defining the recipe (what exactly ran)."""
        module = inspect.getmodule(self.build_model)
        try:
            source = inspect.getsource(module) if module else repr(self)
        except (OSError, TypeError):
            source = repr(self)
        return hashlib.sha256(source.encode()).hexdigest()


class RecipeError(Exception):
    """A recipe could not be loaded."""


@dataclass(frozen=True)
class SkippedSource:
    """A recipe source that failed to load: where, and the error in one line."""

    source: str
    error: str


@dataclass(frozen=True)
class FoundRecipes:
    """The recipes a worker can run, and the sources it skipped (which it publishes)."""

    recipes: dict[str, Recipe]
    skipped: list[SkippedSource]


def load_recipes(recipes_dir: Path | None = None) -> dict[str, Recipe]:
    """Every recipe this worker can run, by name (later sources override earlier ones)."""
    return find_recipes(recipes_dir).recipes


def find_recipes(recipes_dir: Path | None = None) -> FoundRecipes:
    """``load_recipes``, with the sources that failed to load: one broken file (or an
    editor's left-over) must not keep a worker from running the rest. Each is logged."""
    from workers.recipes import builtin

    found: dict[str, Recipe] = {}
    skipped: list[SkippedSource] = []
    _add(found, builtin.RECIPES, "built-in")
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            _add(found, _as_list(ep.load()), f"entry point {ep.name}")
        except Exception as exc:
            skipped.append(_skip(f"entry point {ep.name}", exc))
    if recipes_dir is not None:
        for path in sorted(Path(recipes_dir).glob("*.py")):
            if path.name.startswith("."):  # an editor's lock or backup file, say
                log.debug("ignoring recipe file %s (a dot-file)", path)
                continue
            try:
                _add(found, _load_file(path), str(path))
            except Exception as exc:  # whatever the file's top level raised
                skipped.append(_skip(str(path), exc, path))
    return FoundRecipes(found, skipped)


def _skip(source: str, exc: BaseException, path: Path | None = None) -> SkippedSource:
    """Log a source that failed to load, and say where in the file it failed."""
    if isinstance(exc, SyntaxError):  # its own text spans lines (the code, a caret)
        error = f"{type(exc).__name__}: {exc.msg} (line {exc.lineno})"
    else:
        error = f"{type(exc).__name__}: {exc}".replace("\n", " ")
        here = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == str(path)]
        if here:
            error += f" (line {here[-1].lineno})"
    error = error[:MAX_ERROR_CHARS]
    log.warning("skipping recipes from %s: %s", source, error)
    return SkippedSource(source, error)


def load_package_recipes(package: Path) -> dict[str, Recipe]:
    """The recipes an uploaded code package defines in its root's ``trainyard_recipes.py``
    (which may import the package's other modules: its root goes on ``sys.path``)."""
    path = package / RECIPES_MODULE
    if not path.is_file():
        raise RecipeError(f"the code package has no {RECIPES_MODULE} at its root")
    if str(package) not in sys.path:
        sys.path.insert(0, str(package))
    found: dict[str, Recipe] = {}
    _add(found, _load_file(path), str(path))
    return found


def _add(found: dict[str, Recipe], recipes: Iterable[Recipe], origin: str) -> None:
    for recipe in recipes:
        if recipe.name in found:
            log.warning("recipe %s from %s replaces an earlier one", recipe.name, origin)
        found[recipe.name] = recipe


def _as_list(obj: Any) -> list[Recipe]:
    if isinstance(obj, Recipe):
        return [obj]
    recipes = list(obj)
    if not all(isinstance(r, Recipe) for r in recipes):
        raise RecipeError(f"expected Recipe objects, got {obj!r}")
    return recipes


def _load_file(path: Path) -> list[Recipe]:
    """Import a recipe file and collect the Recipe objects it defines at module level."""
    module_name = f"trainyard_recipes_dir.{path.stem}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise RecipeError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # so pickling and inspect.getsource find it
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]  # half a module is nothing to find later
        raise
    return [obj for obj in vars(module).values() if isinstance(obj, Recipe)]
