"""Virtualenvs for a script job's pip requirements, layered on the worker's own packages.

One virtualenv per requirement set (its hash, with this interpreter's and the bytes of
the package files it names), built once under a file lock, kept in
``<cache_dir>/venvs/<hash>/`` and reused by every job that asks for the same set. It
sees the worker's packages (torch is never reinstalled) through a ``.pth`` file naming
the worker's site-packages: ``--system-site-packages`` alone would reach the base
interpreter's, not those of a worker that itself runs in a virtualenv. pip is the
worker's own (``pip --python``), so a new virtualenv needs no pip of its own.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import threading
import time
import venv
from collections import deque
from pathlib import Path

from service import pip_lines
from service.reasons import ReasonCode
from workers.errors import NotRetryable
from workers.procfs import kill_tree
from workers.venv_names import (
    FILE_OPTIONS,
    READY,
    hold_lock,
    inside,
    requirement_lines,
    venv_key,
)

log = logging.getLogger(__name__)

PIP_TAIL_LINES = 30
# The worker's packages, seen from every job virtualenv.
LAYER_PTH = "_trainyard_worker.pth"


def python_for(
    lines: list[str],
    cache_dir: Path,
    package: Path,
    *,
    timeout_s: float,
    sealed_by: int | None = None,
    private: Path | None = None,
) -> str:
    """The interpreter a script job runs: this one, or a virtualenv with ``lines``.

    Where jobs run as accounts of their own (``sealed_by``: the worker's uid, which seals
    a virtualenv once the attempt that built it ends), a shared virtualenv is used only
    once sealed, or built here; one another account is building, or left, is not: the
    job then builds its own in ``private`` (its folder), as it does when the shared one's
    lock is held past ``timeout_s``."""
    if not lines:
        return sys.executable
    refuse_outside(lines, package)
    key = venv_key(lines, package)
    root = cache_dir / "venvs"
    target = root / key
    if _usable(target, sealed_by):
        return _python(target)
    root.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout_s
    with hold_lock(root / f"{key}.lock", deadline) as locked:
        if locked and _usable(target, sealed_by):
            return _python(target)
        if locked and not _someone_elses(target, sealed_by):
            _build(target, lines, package, timeout_s)
            return _python(target)
    if private is None:
        raise NotRetryable(
            ReasonCode.requirements_failed,
            f"the virtualenv for these requirements is another job's ({target})",
        )
    log.info("the shared virtualenv %s is another job's: building one of this job's own", key)
    own = private / key
    if not (own / READY).exists():
        _build(own, lines, package, max(deadline - time.monotonic(), 1.0))
    return _python(own)


def refuse_outside(lines: list[str], package: Path) -> None:
    """Fail the job, not to be retried, on a line (or one of a file the lines include)
    that names a path outside the package, by its words or through a link: pip would
    read it, and its error would show what it read. Nothing outside is ever read."""
    root = package.resolve()
    todo = [(line, root, "") for line in lines]
    seen: set[Path] = set()
    while todo:
        line, base, source = todo.pop()
        where = f" (in {source})" if source else ""
        folder = base.relative_to(root).as_posix()
        path = pip_lines.outside(line, "" if folder == "." else folder)
        for option, value in pip_lines.raw_words(line) if path is None else []:
            named = pip_lines.local_path(option, value)
            bases = [base] if option in FILE_OPTIONS else [base, root]
            if named is None or all(_within(b / named, root) for b in bases):
                continue
            path = named
        if path is not None:
            raise NotRetryable(
                ReasonCode.requirements_failed, pip_lines.outside_why(line, path) + where
            )
        for option, value in pip_lines.words(line):
            file = inside(base / value, root) if option in FILE_OPTIONS else None
            if file is not None and file.is_file() and file not in seen:
                seen.add(file)
                nested = requirement_lines(file.read_text(errors="replace").splitlines(), root)
                todo += [(x, file.parent, str(file.relative_to(root))) for x in nested]


def _within(path: Path, root: Path) -> bool:
    """Whether ``path``, its links followed, is inside ``root`` (or is not there at all)."""
    try:
        return path.resolve().is_relative_to(root)
    except OSError:  # a word too long to be a file's name, say
        return True


def _python(venv: Path) -> str:
    return str(venv / "bin" / "python")


def _usable(target: Path, sealed_by: int | None) -> bool:
    """Whether a shared virtualenv is whole, and (jobs running as accounts of their own)
    sealed by the worker."""
    try:
        ready = (target / READY).exists()
        return ready and (sealed_by is None or target.stat().st_uid == sealed_by)
    except PermissionError:  # another account's, being built or left
        return False


def _someone_elses(target: Path, sealed_by: int | None) -> bool:
    """Whether ``target`` is there and neither this account's nor the worker's."""
    if sealed_by is None:
        return False
    try:
        owner = target.lstat().st_uid
    except FileNotFoundError:
        return False
    return owner not in (os.getuid(), sealed_by)


def _for_pip(line: str, root: Path) -> str:
    """A line as pip reads it from the virtualenv's copy of the lines: a relative ``-r`` or
    ``-c`` file is the package's (pip would look for it beside the copy)."""
    match = _FILE_LINE.match(line)
    if match is None or Path(match[3]).is_absolute():
        return line
    return f"{match[1]} {root / match[3]}{line[match.end() :]}"


_FILE_LINE = re.compile(rf"^({'|'.join(FILE_OPTIONS)})(=|\s+)?(\S+)")


def _build(target: Path, lines: list[str], package: Path, timeout_s: float) -> None:
    """Build the virtualenv where it will live (its scripts record their path), and mark
    it ready last: one left half-built by a crash is removed and built again."""
    shutil.rmtree(target, ignore_errors=True)
    try:
        venv.EnvBuilder(system_site_packages=True, with_pip=False, symlinks=True).create(target)
        paths = sysconfig.get_paths()
        layers = dict.fromkeys([paths["purelib"], paths["platlib"]])  # once each, in order
        (_site_packages(target) / LAYER_PTH).write_text("".join(f"{p}\n" for p in layers))
        root = package.resolve()
        read = [_for_pip(line, root) for line in lines]
        (target / "requirements.txt").write_text("\n".join(read) + "\n")
        _pip_install(target, lines, package, timeout_s)
        (target / READY).write_text("")
    except BaseException:
        shutil.rmtree(target, ignore_errors=True)
        raise


def _site_packages(root: Path) -> Path:
    found = sorted(root.glob("lib/python*/site-packages"))
    if not found:
        raise RuntimeError(f"no site-packages in the new virtualenv {root}")
    return found[0]


def _pip_install(target: Path, lines: list[str], package: Path, timeout_s: float) -> None:
    """pip's output goes to the job's log; a failure ends the job with pip's last lines."""
    command = [
        sys.executable, "-m", "pip", "--python", str(target / "bin" / "python"),
        "install", "--disable-pip-version-check", "--no-input", "--progress-bar", "off",
        "-r", str(target / "requirements.txt"),
    ]  # fmt: skip
    log.info("installing %d requirement(s) into a new virtualenv: %s", len(lines), lines)
    tail: deque[str] = deque(maxlen=PIP_TAIL_LINES)
    env = {**os.environ, "PIP_NO_CACHE_DIR": "0", "PYTHONUNBUFFERED": "1"}
    with subprocess.Popen(
        command,
        cwd=package,  # "./vendor/x.whl" lines are the package's own files
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        text=True,
        errors="replace",
    ) as pip:
        assert pip.stdout is not None
        try:
            _copy_lines(pip, tail, timeout_s)
        except subprocess.TimeoutExpired:
            # The whole tree: ``pip --python`` runs a second pip under the virtualenv's
            # interpreter, and that one runs build backends, all holding our pipe open.
            kill_tree(pip.pid)
            raise NotRetryable(
                ReasonCode.requirements_failed,
                f"pip install took longer than {timeout_s:.0f}s (TRAINYARD_REQUIREMENTS_TIMEOUT_S)",
            ) from None
    if pip.returncode != 0:
        last = "\n".join(tail)[-1500:]  # the end says why; the message holds 2,000
        offline = "No matching distribution" in last or "Failed to establish" in last
        hint = " (is a package index reachable from this box?)" if offline else ""
        raise NotRetryable(
            ReasonCode.requirements_failed,
            f"pip install failed with exit code {pip.returncode}{hint}:\n{last}"[:2000],
        )


def _copy_lines(pip: subprocess.Popen[str], tail: deque[str], timeout_s: float) -> None:
    """Copy pip's lines to our stdout (the job's log), keeping the last few, until it exits
    or ``timeout_s`` passes (TimeoutExpired)."""
    assert pip.stdout is not None
    stdout = pip.stdout
    # The reader closes the pipe at its end, not Popen: closing it under a blocked read
    # would wait as long as any process pip started holds it open, timeout or not.
    pip.stdout = None

    def copy() -> None:
        with stdout:
            for line in stdout:
                tail.append(line.rstrip())
                sys.stdout.write(f"[pip] {line}")
        sys.stdout.flush()

    reader = threading.Thread(target=copy, daemon=True)
    reader.start()
    pip.wait(timeout=timeout_s)
    reader.join(timeout=5)
