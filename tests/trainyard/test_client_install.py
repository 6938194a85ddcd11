"""The light client distribution (client/pyproject.toml): installed by pip into an empty
virtualenv, it brings none of the server's dependencies and, imported from there, submits
a job to a real server and reads it back."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.stack import REPO, running_stack

pytestmark = pytest.mark.slow

# What only the server needs: none of it may come with the client.
SERVER_ONLY = {"torch", "fastapi", "starlette", "uvicorn", "sqlmodel", "sqlalchemy", "typer"}

SCRIPT = """
import json, sys
import trainyard
from trainyard import Client, NotFound

with Client() as client:
    job = client.submit(recipe="tiny", epochs=1, batch_size=8, params={"samples": 64})
    job.wait(timeout=120)
    try:
        client.job(10**6)
        missing = "found"
    except NotFound as exc:
        missing = exc.status_code
    print(json.dumps({
        "file": trainyard.__file__,
        "server_modules": sorted(
            m for m in sys.modules if m.split(".")[0] in {"torch", "fastapi", "sqlalchemy"}
        ),
        "status": job.status.value,
        "points": len(job.metrics()),
        "artifacts": sorted(a.name for a in job.artifacts()),
        "missing": missing,
    }))
"""


def build_tree(dest: Path) -> Path:
    """client/ and trainyard/ copied as they lie side by side in the repository, so that
    pip's build leaves nothing in the checkout (nor takes a stale build/ from it)."""
    skip = shutil.ignore_patterns("__pycache__", "build", "*.egg-info")
    for name in ("client", "trainyard"):
        shutil.copytree(REPO / name, dest / name, ignore=skip)
    return dest / "client"


def test_the_client_installs_alone_and_talks_to_a_server(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    # No skip when the package registry is unreachable: pip fails, and so does the test.
    pip = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", str(build_tree(tmp_path / "src"))],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert pip.returncode == 0, pip.stdout + pip.stderr
    listed = subprocess.run(
        [str(python), "-m", "pip", "list", "--format", "json"],
        capture_output=True,
        text=True,
        check=True,
    )
    installed = {p["name"].lower().replace("_", "-") for p in json.loads(listed.stdout)}
    assert {"trainyard-client", "httpx", "pydantic", "pathspec"} <= installed
    assert not installed & SERVER_ONLY, installed & SERVER_ONLY

    with running_stack(tmp_path) as stack:
        stack.start_worker()
        # cwd outside the repository and no PYTHONPATH: only the installed copy is found
        env = {k: v for k, v in stack.env.items() if k != "PYTHONPATH"}
        env["TRAINYARD_URL"] = stack.url
        run = subprocess.run(
            [str(python), "-c", SCRIPT],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )
    assert run.returncode == 0, run.stdout + run.stderr
    out = json.loads(run.stdout)
    assert Path(out["file"]).is_relative_to(venv), out["file"]
    assert (Path(out["file"]).parent / "py.typed").is_file(), "type hints marked for checkers"
    assert out["server_modules"] == []
    assert out["status"] == "succeeded"
    assert out["points"] > 0
    assert "model.safetensors" in out["artifacts"], out["artifacts"]
    assert out["missing"] == 404
