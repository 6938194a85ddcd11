"""`trainyard submit --code DIR` packs DIR: the same files give the same digest, ignored
files stay out, links out of DIR are refused, and the server's checks accept the result."""

from __future__ import annotations

import hashlib
import os
import socket
import zipfile
from pathlib import Path

import pytest

from service.packages import check_package
from trainyard.packing import PackError, pack


def project(root: Path) -> Path:
    (root / "pkg").mkdir(parents=True)
    (root / "train.py").write_text("print('hi')\n")
    (root / "run.sh").write_text("#!/bin/sh\n")
    (root / "run.sh").chmod(0o755)
    (root / "pkg" / "model.py").write_text("W = 1\n")
    (root / "data.csv").write_text("1,2\n")
    (root / "logs").mkdir()
    (root / "logs" / "x.log").write_text("x")
    (root / ".gitignore").write_text("*.csv\nlogs/\n")
    (root / ".trainyardignore").write_text("notes.md\n")
    (root / "notes.md").write_text("private\n")
    for left_out in (".git", "__pycache__", "env"):
        (root / left_out).mkdir()
    (root / ".git" / "HEAD").write_text("ref\n")
    (root / "__pycache__" / "m.cpython-311.pyc").write_bytes(b"\0")
    (root / "env" / "pyvenv.cfg").write_text("home = /usr\n")  # a virtualenv by any name
    (root / "env" / "big.so").write_bytes(b"\0" * 100)
    return root


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_same_files_give_the_same_digest(tmp_path: Path) -> None:
    root = project(tmp_path / "p")
    first = pack(root, tmp_path / "a.zip")
    os.utime(root / "train.py", (0, 1_700_000_000))  # timestamps do not matter
    second = pack(root, tmp_path / "b.zip")
    assert digest(first.path) == digest(second.path)
    (root / "train.py").write_text("print('changed')\n")
    assert digest(pack(root, tmp_path / "c.zip").path) != digest(first.path)


def test_ignored_files_and_environments_stay_out(tmp_path: Path) -> None:
    root = project(tmp_path / "p")
    packed = pack(root, tmp_path / "a.zip")
    names = [name for name, _ in packed.files]
    assert names == [".gitignore", ".trainyardignore", "pkg/model.py", "run.sh", "train.py"]
    with zipfile.ZipFile(packed.path) as zf:
        modes = {i.filename: (i.external_attr >> 16) & 0o777 for i in zf.infolist()}
    assert modes["run.sh"] == 0o755 and modes["train.py"] == 0o644
    check_package(packed.path, max_files=10, max_unpacked_bytes=10_000)  # the server agrees


def test_links_inside_are_packed_as_files_and_links_out_are_refused(tmp_path: Path) -> None:
    root = project(tmp_path / "p")
    (root / "alias.py").symlink_to(root / "train.py")
    packed = pack(root, tmp_path / "a.zip")
    with zipfile.ZipFile(packed.path) as zf:
        assert zf.read("alias.py") == b"print('hi')\n"
    (tmp_path / "secret").write_text("key")
    (root / "leak").symlink_to(tmp_path / "secret")
    with pytest.raises(PackError, match="leak is a symbolic link out of the directory"):
        pack(root, tmp_path / "b.zip")


def test_sockets_are_left_out(tmp_path: Path) -> None:
    root = project(tmp_path / "p")
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(root / "agent.sock"))
        names = [name for name, _ in pack(root, tmp_path / "a.zip").files]
    assert "agent.sock" not in names
