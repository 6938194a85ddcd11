"""A job's artifacts in the object store, under the names a listing of its local folder
gives them: the final artifacts as they are named there, the newest whole checkpoint's
files under ``checkpoints/``.

Apart from ``service.artifacts`` because that module is imported where a job runs (its
folder's paths), and this one brings boto3. Every function here blocks on the store:
callers run them in the thread pool.
"""

from __future__ import annotations

import logging

from service.artifacts import ArtifactNotFound, ArtifactRead, is_artifact_name
from service.objects.layout import (
    StoredFile,
    job_prefix,
    newest_checkpoint,
    stored_artifacts,
)
from service.objects.store import ObjectStore

log = logging.getLogger(__name__)

# The checkpoint folder in a job's folder, as the worker names it (workers.jobfiles).
CHECKPOINTS = "checkpoints"


def stored_files(store: ObjectStore, job_id: int) -> dict[str, StoredFile]:
    """The job's whole files in the store, by name: its newest checkpoint's and its final
    artifacts (which win on a name both have: they were written last). Raises the store's
    ``StoreError`` when it cannot be read."""
    # A checkpoint manifest pruned between the listing and its read gives way to the one
    # before (layout.checkpoints_newest_first); artifacts.json is replaced, never removed.
    checkpoint, final = newest_checkpoint(store, job_id), stored_artifacts(store, job_id)
    found: dict[str, StoredFile] = {}
    if checkpoint is not None:
        found.update({f"{CHECKPOINTS}/{f.name}": f for f in checkpoint.files})
    if final is not None:
        found.update({f.name: f for f in final.files})
    return {name: f for name, f in found.items() if _servable(job_id, name, f)}


def _servable(job_id: int, name: str, stored: StoredFile) -> bool:
    """A name a local listing could show, and an object of this job's: a manifest naming
    another job's key (it was edited in the bucket) serves nothing."""
    if not is_artifact_name(name):
        return False
    if not stored.key.startswith(job_prefix(job_id)):
        log.warning(
            "job %s: its manifest names %s, not its own object: left out", job_id, stored.key
        )
        return False
    return True


def find_stored(store: ObjectStore, job_id: int, name: str) -> StoredFile:
    """The stored object of artifact ``name``, or ``ArtifactNotFound``."""
    if not is_artifact_name(name):  # refused before asking the store anything
        raise ArtifactNotFound(f"job {job_id} has no artifact {name!r}")
    stored = stored_files(store, job_id).get(name)
    if stored is None:
        raise ArtifactNotFound(f"job {job_id} has no artifact {name!r}")
    return stored


def merged(local: list[ArtifactRead], stored: dict[str, StoredFile]) -> list[ArtifactRead]:
    """The local files, and the stored ones no local file shares a name with, by name."""
    here = {a.name for a in local}
    found = local + [
        ArtifactRead(name=name, size=f.size) for name, f in stored.items() if name not in here
    ]
    return sorted(found, key=lambda a: a.name)
