"""A job's inputs, placed by the supervisor before its runner needs them: the code
package unpacked once per digest (read-only, in the cache), and links to the job's data
files in its inputs folder. The supervisor does this because a blob may have to be
fetched from the API, with the API token: a runner holds no credential.
"""

from __future__ import annotations

from pathlib import Path

from service.models import Job
from service.settings import Settings
from workers.blob_cache import BlobCache
from workers.jobfiles import JobFiles


def place(settings: Settings, job: Job, files: JobFiles) -> Path | None:
    """The job's package, unpacked, with its data files linked under ``files.inputs``;
    None for a job that brings no code."""
    if job.code is None:
        return None
    cache = BlobCache(settings)
    package = cache.code(job.code)
    link_data(cache, job.data or {}, files.inputs)
    return package


def link_data(cache: BlobCache, data: dict[str, str], folder: Path) -> None:
    """Each data file at ``folder/<name>``: a link to the read-only cached blob."""
    folder.mkdir(parents=True, exist_ok=True)
    for entry in folder.iterdir():  # what an earlier attempt placed
        entry.unlink()
    for name, digest in data.items():
        (folder / name).symlink_to(cache.blob(digest))
