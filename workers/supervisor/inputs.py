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
from workers.supervisor import nofollow
from workers.supervisor.blob_cache import BlobCache


def place(settings: Settings, job: Job, files: JobFiles) -> tuple[Path | None, list[Path]]:
    """The job's package, unpacked, with its data files linked under ``files.inputs``
    (None for a job that brings no code); and every path the job reads there."""
    if job.code is None:
        return None, []
    cache = BlobCache(settings)
    package = cache.code(job.code)
    blobs = {name: cache.blob(digest) for name, digest in (job.data or {}).items()}
    files.root.mkdir(parents=True, exist_ok=True)  # in jobs/, which only the worker changes
    # The job's folder may hold its own links (it owned the folder on an earlier attempt):
    # the inputs folder is made anew without following one.
    nofollow.place_links(files.root, files.inputs, blobs)
    return package, [package, *blobs.values()]
