"""The API process stays light: it never imports torch or the workers package."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

CHECK = """
import sys
from service.app import create_app
from service.settings import Settings
import service.cli
app = create_app(Settings(database_url="sqlite://"))
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "workers", "numpy"))
assert not heavy, heavy
"""


def test_api_never_imports_torch_or_workers() -> None:
    result = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_the_worker_starts_its_zygote_before_it_imports_torch() -> None:
    # The zygote's imports and the worker's own then run at once, not one after the other.
    check = "import sys, workers.supervisor; assert 'torch' not in sys.modules"
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


def test_the_import_finder_sees_imports_inside_functions(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text("def f():\n    import torch.nn\n    from workers import runner\n")
    assert _imported_packages(source) == [(2, "torch"), (3, "workers")]
