"""Packing a project directory into a code package, the same way every time.

The same files give the same bytes, so the same digest, and an unchanged project is
never uploaded twice: entries sorted, every timestamp 1980-01-01, modes 0644 (0755 for
executables). Left out: what the directory's ``.gitignore`` and ``.trainyardignore``
match, and always ``.git/``, ``__pycache__/``, virtualenvs, sockets and other special
files. A symlink to a file inside the directory is packed as that file; one that leaves
the directory is refused (a package holds no links, and must not carry files from
elsewhere on the machine).
"""

from __future__ import annotations

import hashlib
import os
import stat
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pathspec

IGNORE_FILES = (".gitignore", ".trainyardignore")
ALWAYS_LEFT_OUT = (".git/", "__pycache__/", "*.pyc", ".venv/", "venv/", ".mypy_cache/")
FIXED_TIME = (1980, 1, 1, 0, 0, 0)  # the earliest a zip can hold
CHUNK_BYTES = 2**20


class PackError(Exception):
    """The directory cannot be packed (a link out of it, say)."""


@dataclass(frozen=True)
class Packed:
    path: Path  # the zip written
    files: list[tuple[str, int]]  # (name, size) of each file packed


def pack(directory: Path, dest: Path) -> Packed:
    """Write ``directory``'s files (minus the ignored) to the zip ``dest``."""
    root = directory.resolve()
    if not root.is_dir():
        raise PackError(f"{directory} is not a directory")
    ignored = _ignore_spec(root)
    files = sorted(_walk(root, ignored))
    with zipfile.ZipFile(dest, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=6) as zf:
        for name, path in files:
            info = zipfile.ZipInfo(name, date_time=FIXED_TIME)
            executable = os.stat(path).st_mode & 0o111
            info.external_attr = (stat.S_IFREG | (0o755 if executable else 0o644)) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            with open(path, "rb") as source, zf.open(info, "w") as out:
                while chunk := source.read(CHUNK_BYTES):
                    out.write(chunk)
    return Packed(dest, [(name, os.stat(path).st_size) for name, path in files])


def _ignore_spec(root: Path) -> pathspec.GitIgnoreSpec:
    lines = list(ALWAYS_LEFT_OUT)
    for name in IGNORE_FILES:
        path = root / name
        if path.is_file():
            lines += path.read_text().splitlines()
    return pathspec.GitIgnoreSpec.from_lines(lines)


def _walk(root: Path, ignored: pathspec.GitIgnoreSpec) -> list[tuple[str, Path]]:
    """(name in the package, path) of every file to pack."""
    found = []
    for directory, subdirs, names in os.walk(root):
        here = Path(directory)
        rel = here.relative_to(root)
        keep = []
        for sub in sorted(subdirs):
            path = here / sub
            name = (rel / sub).as_posix()
            if ignored.match_file(name + "/") or (path / "pyvenv.cfg").exists():
                continue  # ignored, or a virtualenv
            if path.is_symlink():
                _check_link(root, path, name)  # a link to a directory: refused either way
                raise PackError(f"{name} is a symbolic link to a directory; packages hold none")
            keep.append(sub)
        subdirs[:] = keep
        for file in sorted(names):
            path = here / file
            name = (rel / file).as_posix()
            if ignored.match_file(name):
                continue
            if path.is_symlink():
                _check_link(root, path, name)
            mode = os.stat(path).st_mode  # follows a link inside the directory
            if not stat.S_ISREG(mode):
                continue  # a socket, FIFO or device: never part of a project
            found.append((name, path))
    return found


def _check_link(root: Path, path: Path, name: str) -> None:
    target = path.resolve()
    if not target.is_relative_to(root):
        raise PackError(f"{name} is a symbolic link out of the directory (to {target})")
    if not target.exists():
        raise PackError(f"{name} is a broken symbolic link")


def digest_of(path: Path) -> str:
    """``sha256:<hex>`` of a file, read in chunks: the name the server stores it under."""
    hasher = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            hasher.update(chunk)
    return f"sha256:{hasher.hexdigest()}"
