"""Where a job's files live under the data dir, and safe access to them."""

from __future__ import annotations

import os
from pathlib import Path

from service.errors import TrainyardError


class ArtifactNotFound(TrainyardError):
    """No such file among a job's artifacts."""


def job_dir(data_dir: Path, job_id: int) -> Path:
    """The folder holding a job's model, resolved spec and checkpoints."""
    return Path(data_dir) / "jobs" / str(job_id)


def list_artifacts(data_dir: Path, job_id: int) -> list[dict[str, object]]:
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
            found.append({"name": path.relative_to(root).as_posix(), "size": path.stat().st_size})
    return sorted(found, key=lambda a: str(a["name"]))


def artifact_path(data_dir: Path, job_id: int, name: str) -> Path:
    """The file behind an artifact name; refuses anything outside the job's folder, and
    any path through a symbolic link (its resolved path would differ from the plain one)."""
    root = job_dir(data_dir, job_id).resolve()
    plain = Path(os.path.normpath(root / name))
    path = plain.resolve()
    hidden = any(part.startswith(".") for part in Path(name).parts)
    if hidden or path != plain or not path.is_relative_to(root) or not path.is_file():
        raise ArtifactNotFound(f"job {job_id} has no artifact {name!r}")
    return path
