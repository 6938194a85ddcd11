"""A job's inputs, placed by the supervisor before its runner needs them: the code
package unpacked once per digest (read-only, in the cache), and links to the job's data
files in its inputs folder. The supervisor does this because a blob may have to be
fetched from the API, with the API token: a runner holds no credential.
"""

from __future__ import annotations

from pathlib import Path

from service.models import Job
from service.settings import Settings
from workers.jobfiles import JobFiles
from workers.supervisor.blob_cache import BlobCache


def place(settings: Settings, job: Job, files: JobFiles) -> tuple[Path | None, list[Path]]:
    """The job's package, unpacked, with its data files linked under ``files.inputs``
    (None for a job that brings no code); and every path the job reads there."""
    if job.code is None:
        return None, []
    cache = BlobCache(settings)
    package = cache.code(job.code)
    return package, [package, *link_data(cache, job.data or {}, files.inputs)]


def link_data(cache: BlobCache, data: dict[str, str], folder: Path) -> list[Path]:
    """Each data file at ``folder/<name>``: a link to the read-only cached blob; returns
    the blobs."""
    folder.mkdir(parents=True, exist_ok=True)
    for entry in folder.iterdir():  # what an earlier attempt placed
        entry.unlink()
    blobs = []
    for name, digest in data.items():
        blob = cache.blob(digest)
        (folder / name).symlink_to(blob)
        blobs.append(blob)
    return blobs
