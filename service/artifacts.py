"""Where a job's files live under the data dir, and safe access to them."""

from __future__ import annotations

from pathlib import Path

from service.errors import TrainyardError


class ArtifactNotFound(TrainyardError):
    """No such file among a job's artifacts."""


def job_dir(data_dir: Path, job_id: int) -> Path:
    """The folder holding a job's model, resolved spec and checkpoints."""
    return Path(data_dir) / "jobs" / str(job_id)


def list_artifacts(data_dir: Path, job_id: int) -> list[dict[str, object]]:
    """Files of a job, by path relative to its folder (hidden working files left out)."""
    root = job_dir(data_dir, job_id)
    if not root.is_dir():
        return []
    return [
        {"name": p.relative_to(root).as_posix(), "size": p.stat().st_size}
        for p in sorted(root.rglob("*"))
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts)
    ]


def artifact_path(data_dir: Path, job_id: int, name: str) -> Path:
    """The file behind an artifact name; refuses anything outside the job's folder."""
    root = job_dir(data_dir, job_id).resolve()
    path = (root / name).resolve()
    hidden = any(part.startswith(".") for part in Path(name).parts)
    if hidden or not path.is_relative_to(root) or not path.is_file():
        raise ArtifactNotFound(f"job {job_id} has no artifact {name!r}")
    return path
