"""Where a job's files live under the data dir, and safe access to them."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO

from pydantic import BaseModel, Field

from service.errors import TrainyardError


class ArtifactRead(BaseModel):
    name: str = Field(description="Its path in the job's folder.", examples=["model.safetensors"])
    size: int = Field(description="Bytes.", examples=[4_194_304])


class ArtifactNotFound(TrainyardError):
    """No such file among a job's artifacts."""


def job_dir(data_dir: Path, job_id: int) -> Path:
    """The folder holding a job's model, resolved spec and checkpoints."""
    return Path(data_dir) / "jobs" / str(job_id)


def list_artifacts(data_dir: Path, job_id: int) -> list[ArtifactRead]:
    """Files of a job, by path relative to its folder: regular files only, hidden working
    files left out, and no symbolic link followed or listed (a script writes what it
    likes to its output folder, links to other jobs' files or the box's included)."""
    root = job_dir(data_dir, job_id)
    found = []
    for directory, subdirs, files in os.walk(root):  # never descends into a linked dir
        here = Path(directory)
        subdirs[:] = sorted(d for d in subdirs if not d.startswith("."))
        for name in files:
            path = here / name
            if name.startswith(".") or path.is_symlink() or not path.is_file():
                continue
            rel = path.relative_to(root).as_posix()
            found.append(ArtifactRead(name=rel, size=path.stat().st_size))
    return sorted(found, key=lambda a: a.name)


def is_artifact_name(name: str) -> bool:
    """A path below a job's folder that a listing may show: no hidden part (working files,
    a job's inputs), no ``..``, not absolute."""
    parts = Path(name).parts
    return bool(parts) and not any(p.startswith(".") or p in ("..", "/") for p in parts)


def open_artifact(data_dir: Path, job_id: int, name: str) -> tuple[BinaryIO, int]:
    """The artifact's file, open, and its size; refuses anything outside the job's folder
    and any path through a symbolic link, checked as it is opened: each folder on the way
    is opened with O_NOFOLLOW relative to the one before, so a job's code cannot swap a
    file for a link between the check and the read (a job may run as another account
    than the API, and link to what the API can read and it cannot)."""
    if not is_artifact_name(name):
        raise ArtifactNotFound(f"job {job_id} has no artifact {name!r}")
    parts = Path(name).parts
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(job_dir(data_dir, job_id), flags | os.O_DIRECTORY)
        for part in parts[:-1]:
            below = os.open(part, flags | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = below
        try:
            file = os.open(parts[-1], flags | os.O_NONBLOCK, dir_fd=fd)
        finally:
            os.close(fd)
    except OSError as exc:  # missing, or a link (ELOOP), or not a folder
        raise ArtifactNotFound(f"job {job_id} has no artifact {name!r}") from exc
    st = os.fstat(file)
    if not stat.S_ISREG(st.st_mode):
        os.close(file)
        raise ArtifactNotFound(f"job {job_id} has no artifact {name!r}")
    os.set_blocking(file, True)
    return os.fdopen(file, "rb"), st.st_size
