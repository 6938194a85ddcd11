"""A job's inputs, placed by the supervisor before its runner needs them: the code
package unpacked once per digest (read-only, in the cache), and links to the job's data
files in its inputs folder. The supervisor does this because a blob may have to be
fetched from the API, with the API token: a runner holds no credential.
"""

from __future__ import annotations

from pathlib import Path

from service.errors import PackageInvalid
from service.models import Job
from service.objects.store import ObjectStore
from service.reasons import ReasonCode
from service.settings import Settings
from workers.errors import NotRetryable
from workers.jobfiles import JobFiles
from workers.supervisor import nofollow
from workers.supervisor.blob_cache import BlobCache
from workers.supervisor.cache_budget import Holds


def place(
    settings: Settings,
    job: Job,
    files: JobFiles,
    holds: Holds | None = None,
    objects: ObjectStore | None = None,
) -> tuple[Path | None, list[Path]]:
    """The job's package, unpacked, with its data files linked under ``files.inputs``
    (None for a job that brings no code); and every path the job reads there. ``holds``:
    the attempt's, on every cache entry it uses (its virtualenv's too) until it ends;
    ``objects``: the object store, where a blob missing here is fetched from first."""
    if job.code is None:
        return None, []
    cache = BlobCache(settings, holds, objects)
    try:
        package = cache.code(job.code)
    except PackageInvalid as exc:
        # The same bytes fail the same way on every attempt (a member that holds more or
        # less than the archive declares, a damaged one): the job's, not the worker's.
        raise NotRetryable(ReasonCode.bad_spec, f"{exc}; upload a new package") from exc
    blobs = {name: cache.blob(digest) for name, digest in (job.data or {}).items()}
    if holds is not None:
        if job.entrypoint is not None:  # a script job: its runner builds or reuses one
            holds.hold_venv(job.requirements, package)
        holds.settle()
    files.root.mkdir(parents=True, exist_ok=True)  # in jobs/, which only the worker changes
    # The job's folder may hold its own links (it owned the folder on an earlier attempt):
    # the inputs folder is made anew without following one.
    nofollow.place_links(files.root, files.inputs, blobs)
    return package, [package, *blobs.values()]
