"""Script jobs for the tests: the examples packed as the CLI packs them, the digits data,
and uploads to a running stack."""

from __future__ import annotations

import hashlib
from pathlib import Path

import httpx

from tests.stack import REPO
from trainyard.packing import pack

EXAMPLES = REPO / "examples"


def put_blob(http: httpx.Client, path: Path) -> str:
    """Upload a file to the stack's API (``http``: its /api/v1 client); its digest."""
    data = path.read_bytes()
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    r = http.put(f"/blobs/{digest}", content=data)
    assert r.status_code in (200, 201), r.text
    return digest


def put_package(http: httpx.Client, directory: Path, tmp: Path) -> str:
    """Pack ``directory`` (deterministically, as ``trainyard submit --code`` does) and
    upload it; its digest."""
    return put_blob(http, pack(directory, tmp / f"{directory.name}.zip").path)


def digits_file(tmp: Path) -> Path:
    """scikit-learn's 8x8 digits as digits.npz (examples/make_digits.py)."""
    import runpy

    path = tmp / "digits.npz"
    if not path.exists():
        make = runpy.run_path(str(EXAMPLES / "make_digits.py"))
        make["main"](str(path))
    return path
