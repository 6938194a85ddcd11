"""A script job's virtualenvs as both sides of the worker name them: the key of a
requirement set (the folder ``<cache_dir>/venvs/<key>``), the lock its builder holds, and
the file that says it is whole. The runner builds and uses them (``workers.script.venvs``);
the supervisor holds a running job's and evicts the least recently used
(``workers.supervisor.cache_budget``), so neither imports the other's side.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from service import pip_lines

READY = ".ready"  # written last: the virtualenv is whole
LOCK_POLL_S = 0.2  # another job builds the same set: look again this often
EDITABLE = ("-e", "--editable")
# pip reads -r and -c files relative to the file that names them, and follows their
# lines in turn.
FILE_OPTIONS = pip_lines.FILE_OPTIONS


def requirement_lines(requirements: list[str] | None, package: Path) -> list[str]:
    """The job's requirement lines, else its package's requirements.txt, without comments
    and blank lines."""
    if requirements is None:
        path = package / "requirements.txt"
        requirements = path.read_text().splitlines() if path.is_file() else []
    lines = [line.split(" #")[0].strip() for line in requirements]
    return [line for line in lines if line and not line.startswith("#")]


@contextmanager
def hold_lock(path: Path, deadline: float) -> Iterator[bool]:
    """The requirement set's lock, held (True), or not had by ``deadline`` (False): a lock
    another account made, or holds that long, must not hold this job forever."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o660)
    except OSError:  # another account's, closed to this one
        yield False
        return
    try:
        if os.fstat(fd).st_uid == os.getuid():
            os.fchmod(fd, 0o660)  # the umask made it 0600: every job account locks it
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    yield False
                    return
                time.sleep(LOCK_POLL_S)
        yield True
    finally:
        os.close(fd)


@contextmanager
def lock_if_free(venvs: Path, key: str) -> Iterator[bool]:
    """The requirement set's lock if no one holds it now (True), else False at once: the
    worker's cache upkeep removes a virtualenv under it, never while a job builds it."""
    with hold_lock(venvs / f"{key}.lock", time.monotonic() - 1) as held:
        yield held


def venv_key(lines: list[str], package: Path) -> str:
    """A requirement set's virtualenv name: this interpreter, the lines, and what they
    name inside the package (``./wheels/x.whl``, ``--find-links ./wheels``, ``-r more.txt``
    and what that names): its bytes, so a wheel rebuilt under the same file name in a new
    package gets a virtualenv of its own, not the one the old wheel made. An editable
    folder (``-e .``) is keyed by where it is, not its bytes: the virtualenv points there,
    and the package folder's name is its digest."""
    key = hashlib.sha256("\n".join([sys.executable, *sorted(lines)]).encode())
    root = package.resolve()
    for path, editable in named_paths(lines, root).items():
        key.update(f"\0{path.relative_to(root)}\0".encode())
        key.update(str(path).encode() if editable else tree_digest(path))
    return key.hexdigest()[:32]


def named_paths(lines: list[str], root: Path) -> dict[Path, bool]:
    """The package's own files and folders that requirement lines name, those of the
    requirement files they name too, each once, with whether it is installed editable. A
    word names a path as pip decides it: an option's file, or a word with a "/", a leading
    "." or an archive's name; a project name is not one, even beside a folder so named."""
    found: dict[Path, bool] = {}
    todo = [(line, root) for line in sorted(lines)]
    while todo:
        line, base = todo.pop()
        for option, value in pip_lines.words(line):
            if option in FILE_OPTIONS:
                path = inside(base / value, root)
            elif "/" in value or value.startswith(".") or value.endswith(pip_lines.ARCHIVES):
                path = inside(root / value, root)  # pip's working folder is the package
            else:
                continue
            if path is None or path in found:
                continue
            found[path] = option in EDITABLE
            if option in FILE_OPTIONS and path.is_file():
                nested = path.read_text(errors="replace").splitlines()
                todo += [(x, path.parent) for x in requirement_lines(nested, root)]
    return found


def inside(path: Path, root: Path) -> Path | None:
    """``path`` resolved, if it exists inside the package."""
    try:
        resolved = path.resolve()
        return resolved if resolved.is_relative_to(root) and resolved.exists() else None
    except OSError:  # a word too long to be a file's name, say
        return None


def tree_digest(path: Path) -> bytes:
    """SHA-256 over a file's bytes, or over a folder's files (names and bytes, in order)."""
    digest = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for file in files:
        digest.update(f"\0{file.relative_to(path)}\0".encode())
        with open(file, "rb") as f:
            digest.update(hashlib.file_digest(f, "sha256").digest())
    return digest.digest()
