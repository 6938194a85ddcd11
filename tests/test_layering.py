"""The API process stays light: it never imports torch or the workers package."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

CHECK = """
import sys
from service.app import create_app
from service.settings import Settings
import service.cli
app = create_app(Settings(database_url="sqlite://"))
heavy = sorted(
    m for m in sys.modules if m.split(".")[0] in ("torch", "workers", "numpy", "optuna")
)
assert not heavy, heavy
"""


def test_api_never_imports_torch_or_workers() -> None:
    result = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_the_worker_starts_its_zygote_before_it_imports_torch() -> None:
    # The zygote's imports and the worker's own then run at once, not one after the other.
    check = "import sys, workers.supervisor.loop; assert 'torch' not in sys.modules"
    result = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


HEAVY = ("torch", "numpy", "workers")
# The composition root: `trainyard worker` starts the supervisor, so it imports workers.
COMPOSITION_ROOT = "service/cli/service.py"


def _imported_packages(path: Path) -> list[tuple[int, str]]:
    """(line, top-level package) of every import in a file, at any depth: a function
    that imports torch is as heavy as a module that does, once it is called."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name.split(".")[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module.split(".")[0]))
    return found


def test_no_service_module_imports_torch_or_workers_even_inside_a_function() -> None:
    repo = Path(__file__).resolve().parents[1]
    offenders = [
        f"{path.relative_to(repo)}:{line} imports {package}"
        for path in sorted((repo / "service").rglob("*.py"))
        if path.relative_to(repo).as_posix() != COMPOSITION_ROOT
        for line, package in _imported_packages(path)
        if package in HEAVY
    ]
    assert not offenders, offenders


def test_only_the_sweeps_search_imports_optuna() -> None:
    # Optuna brings numpy: the API imports it only when its driver first drives a sweep.
    repo = Path(__file__).resolve().parents[1]
    importers = sorted(
        path.relative_to(repo).as_posix()
        for path in (repo / "service").rglob("*.py")
        if any(package == "optuna" for _, package in _imported_packages(path))
    )
    assert importers == ["service/sweeps/search.py"]


def test_the_import_finder_sees_imports_inside_functions(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text("def f():\n    import torch.nn\n    from workers import runner\n")
    assert _imported_packages(source) == [(2, "torch"), (3, "workers")]


WORKERS = Path(__file__).resolve().parents[1] / "workers"
# The job's side: the runner of an attempt, its ranks, a script's launch. They run as the
# job's account beside the job's code, and hold no credential: nothing there may reach
# the database, the API (with the worker's token) or the supervisor's modules.
JOB_SIDE = ("runner", "ranks", "script")
NEVER_ON_THE_JOB_SIDE = ("service.store", "service.db", "workers.supervisor", "httpx")


def _imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every absolute import in a file, at any depth."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def test_the_job_side_imports_nothing_that_reaches_the_database_or_the_api() -> None:
    offenders = [
        f"{path.relative_to(WORKERS.parent)}:{line} imports {module}"
        for package in JOB_SIDE
        for path in sorted((WORKERS / package).rglob("*.py"))
        for line, module in _imported_modules(path)
        if module.startswith(NEVER_ON_THE_JOB_SIDE)
    ]
    assert not offenders, offenders


# The worker's own processes: a box's supervisor, and the worker in front of Slurm.
WORKER_SIDE = ("supervisor", "slurm")


@pytest.mark.parametrize("package", WORKER_SIDE)
def test_the_supervisor_imports_nothing_of_the_job_side(package: str) -> None:
    offenders = [
        f"{path.relative_to(WORKERS.parent)}:{line} imports {module}"
        for path in sorted((WORKERS / package).rglob("*.py"))
        for line, module in _imported_modules(path)
        if module.startswith(tuple(f"workers.{p}" for p in JOB_SIDE))
    ]
    assert not offenders, offenders


@pytest.mark.parametrize("package", WORKER_SIDE)
def test_no_supervisor_module_imports_torch_as_it_is_imported(package: str) -> None:
    """Each module of the supervisor's package (and the Slurm worker's), imported alone,
    leaves torch unloaded (the zygote imports it meanwhile); it imports torch only inside
    functions that need it."""
    modules = sorted(
        f"workers.{package}." + path.relative_to(WORKERS / package).with_suffix("").as_posix()
        for path in (WORKERS / package).rglob("*.py")
        if path.name != "__init__.py"
    )
    check = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "assert 'torch' not in sys.modules, sorted(sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_a_runner_imports_torch_only_once_its_walls_are_up() -> None:
    """A cold runner enters a user namespace after its imports; torch starts a thread as
    it is imported, and a process with threads cannot: so its module must not pull it."""
    check = (
        "import os, sys, workers.runner.main\n"
        "assert 'torch' not in sys.modules\n"
        "assert len(os.listdir('/proc/self/task')) == 1\n"
    )
    result = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


CLIENT = Path(__file__).resolve().parents[1] / "trainyard"
# What the client distribution installs with (client/pyproject.toml), and the standard
# library: the client must install and import without the server or torch.
CLIENT_MAY_IMPORT = {"httpx", "pydantic", "pathspec", "trainyard"}


def test_the_client_imports_only_its_own_light_dependencies() -> None:
    offenders = [
        f"{path.relative_to(CLIENT.parent)}:{line} imports {package}"
        for path in sorted(CLIENT.rglob("*.py"))
        for line, package in _imported_packages(path)
        if package not in CLIENT_MAY_IMPORT and package not in sys.stdlib_module_names
    ]
    assert not offenders, offenders
