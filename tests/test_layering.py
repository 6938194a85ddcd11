"""The API process stays light: it never imports torch or the workers package."""

from __future__ import annotations

import subprocess
import sys

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
