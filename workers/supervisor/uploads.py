"""What an attempt leaves goes to the object store before the job moves on: its last
checkpoint (a SIGTERM's, at the exact batch) and, from the node that wrote them, the job's
artifacts (the final weights, spec.json, the output folder).

This runs in a thread of its own once the attempt's processes are gone; the supervisor's
loop records the attempt's end only when it is done, so a job is requeued (and may start
on another box) only once its newest checkpoint is whole in the store, and shown
finished only once its weights can be downloaded from any box. A store that cannot be
reached holds the end up to ``STORAGE_FLUSH_S``; then the job moves on and its log says
what stayed on this box's disk.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path

from service.objects import layout
from service.objects.layout import Manifest, StoredFile
from service.objects.store import ObjectStore, StoreError
from workers.jobfiles import MODEL_FILE, OUTPUT, SPEC_FILE
from workers.supervisor import nofollow
from workers.supervisor.checkpoint_sync import RETRY_FIRST_S, RETRY_MOST_S, CheckpointSync, scan

log = logging.getLogger(__name__)


class EndUploads:
    """One ended attempt's last uploads, in a thread; ``done`` once they are in the store
    or given up on."""

    def __init__(
        self,
        sync: CheckpointSync,
        *,
        artifacts: bool,
        timeout_s: float,
        note: Callable[[str], None],
        on_done: Callable[[], None],
    ) -> None:
        """``artifacts``: this node wrote the job's artifacts (one box, or the leader);
        ``on_done``: called from the thread when done (the supervisor wakes)."""
        self.sync = sync
        self.artifacts = artifacts
        self.timeout_s = timeout_s
        self.note = note
        self.on_done = on_done
        self.done = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"end-uploads-{sync.job_id}", daemon=True
        )
        self._thread.start()

    def _run(self) -> None:
        started = time.monotonic()
        try:
            try:
                if not self.sync.flush(self.timeout_s) and not self.sync.cancelled:
                    self.note(
                        f"checkpoints: the newest stays on this box's disk only, the object "
                        f"store did not take it in {self.timeout_s:.0f}s ({self.sync.trouble})"
                    )
            except Exception:  # the artifacts still go up
                log.exception("job %s: its last checkpoint upload failed", self.sync.job_id)
            if self.artifacts and not self.sync.cancelled:
                left = max(0.0, self.timeout_s - (time.monotonic() - started))
                self._artifacts(left)
        except Exception:  # the job's end must be recorded whatever happened here
            log.exception("job %s: its last uploads failed", self.sync.job_id)
        finally:
            self.done.set()
            self.on_done()

    def _artifacts(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        wait = RETRY_FIRST_S
        while True:
            try:
                manifest = upload_artifacts(
                    self.sync.store, self.sync.job_id, self.sync.root, lambda: self.sync.cancelled
                )
            except (StoreError, OSError) as exc:
                if time.monotonic() + wait > deadline:
                    self.note(f"artifacts: not in the object store, on this box only: {exc}")
                    return
                time.sleep(wait)
                wait = min(wait * 2, RETRY_MOST_S)
                continue
            if manifest.files:
                total = sum(f.size for f in manifest.files)
                self.note(
                    f"artifacts: {len(manifest.files)} files ({total / 1e6:.1f} MB) "
                    "uploaded to the object store"
                )
            return


def _regular(path: Path) -> bool:
    """A regular file, not a link to one (a job may plant a link where its weights go)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


def upload_artifacts(
    store: ObjectStore, job_id: int, root: Path, cancelled: Callable[[], bool] = lambda: False
) -> Manifest:
    """The job's final files (weights, spec.json, output/) into the store, then the
    manifest that makes them its artifacts; never through a link in the job's folder.
    ``cancelled``: the lease was lost meanwhile: no manifest is written."""
    names = [n for n in (MODEL_FILE, SPEC_FILE) if _regular(root / n)]
    output = root / OUTPUT
    if output.is_dir() and not output.is_symlink():
        names += [f"{OUTPUT}/{name}" for name in scan(output)]
    files = []
    for name in sorted(names):
        if cancelled():
            return Manifest(job_id=job_id)
        fd = nofollow.open_file(root, root / name)
        with os.fdopen(fd, "rb") as file:
            size = os.fstat(fd).st_size
            key = layout.artifact_key(job_id, name)
            store.put_file(key, file)
        files.append(StoredFile(name=name, key=key, size=size))
    manifest = Manifest(job_id=job_id, written_at=time.time(), files=files)
    if files and not cancelled():
        layout.publish_artifacts(store, manifest)
    return manifest
