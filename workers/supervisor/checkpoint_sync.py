"""A job's checkpoints in the object store: uploaded as they are written, downloaded
where an attempt resumes. The supervisor does both: it holds the store's credentials,
and a job's processes never do (nor reach the store: their network is loopback only).

Training never waits for the store. Rank 0 (or a script) writes its checkpoint to the
job's folder on this box's disk, as without a store; a ``CheckpointSync`` thread per
attempt sees the folder change and uploads it, the files first and then a manifest
naming them (``service.objects.layout``), so only a checkpoint whole in the store counts.
While the store cannot be reached the checkpoints wait on this disk (the folder holds
what the job keeps, the recipes' two newest: that is the bound) and the sync tries again,
saying so in the job's log and reason; the newest folder state goes up once it answers.

A file is uploaded once per version: a version is its inode, size and modification time
(a checkpoint written whole is a new inode, renamed into place), so a folder of two
checkpoints where one is new sends one file. Each file is opened before it is sent and
read from that descriptor: a newer checkpoint renamed over it meanwhile does not mix
into the upload, and one written to in place meanwhile (its size or time changed) is sent
again at the next look. A script whose checkpoint is several files should write each
whole (a temp name, then a rename) and the set in an order that a resume can trust.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from pydantic import BaseModel

from service.objects import layout
from service.objects.layout import Manifest, StoredFile
from service.objects.store import ObjectMissing, ObjectStore, StoreError
from workers.supervisor import nofollow

log = logging.getLogger(__name__)

# After a failed upload the sync waits this long, doubling to the most, before the next.
RETRY_FIRST_S = 1.0
RETRY_MOST_S = 30.0


class Version(NamedTuple):
    """One version of a file: a file rewritten whole is another inode."""

    inode: int
    size: int
    mtime_ns: int


# A checkpoint folder's files by name (relative, with /), as they are now.
Snapshot = dict[str, Version]


def scan(folder: Path) -> Snapshot:
    """The regular files below ``folder``, by relative name; hidden names (files being
    written, ``.x.tmp-pid``) and links left out, none followed."""
    found: Snapshot = {}
    for directory, subdirs, names in os.walk(folder):  # never descends into a linked dir
        here = Path(directory)
        subdirs[:] = [d for d in subdirs if not d.startswith(".")]
        for name in names:
            if name.startswith("."):
                continue
            try:
                st = os.lstat(here / name)
            except FileNotFoundError:
                continue  # pruned meanwhile
            if stat.S_ISREG(st.st_mode):
                rel = (here / name).relative_to(folder).as_posix()
                if _storable(rel):
                    found[rel] = Version(st.st_ino, st.st_size, st.st_mtime_ns)
    return found


MARK_LIMIT = 4 * 1024 * 1024


class _Stopped(Exception):
    """A restore stopped between two files: its attempt ended meanwhile."""


class Mark(BaseModel):
    """What ``_remember`` notes: a manifest's id and the folder it named, as on this box."""

    manifest: str
    files: dict[str, Version]


@dataclass
class Synced:
    """What the store holds of this folder: the keys of the versions uploaded (or
    downloaded) by this attempt, and the folder as the last manifest named it."""

    keys: dict[Version, str] = field(default_factory=dict)
    published: Snapshot | None = None


class CheckpointSync:
    """One attempt's checkpoint folder, kept in the store; its thread starts once the
    folder has been restored (``restore``), before the runner is handed its job."""

    def __init__(
        self,
        store: ObjectStore,
        *,
        job_id: int,
        attempt: int,
        node: int,
        root: Path,
        folder: Path,
        interval_s: float,
        on_trouble: Callable[[str | None], None],
    ) -> None:
        """``root``: the job's folder (nothing is opened through a link below it);
        ``folder``: its checkpoint folder; ``on_trouble``: told why uploads wait (a
        sentence), and None once they work again."""
        self.store = store
        self.job_id, self.attempt, self.node = job_id, attempt, node
        self.root, self.folder = root, folder
        self.interval_s = interval_s
        self.on_trouble = on_trouble
        self.synced = Synced()
        self._stop = threading.Event()
        self._lock = threading.Lock()  # one upload at a time: the thread's, or the flush's
        self._life = threading.Lock()  # start against flush and close
        self._closed = False  # the attempt ended: the thread does not start after that
        self._cancelled = False  # the lease was lost: nothing more is published
        self._restoring = threading.Lock()  # the flush waits for a restore under way
        self._thread: threading.Thread | None = None
        self.trouble: str | None = None
        self.seq = 0  # the number of the newest manifest this sync restored or wrote

    # -- resume ---------------------------------------------------------------------------

    def restore(self, *, always: bool) -> str | None:
        """Make the checkpoint folder the newest whole one in the store, unless this box's
        is newer (written after it and not uploaded yet; ``always``: take the store's
        anyway, as every node of a job across boxes must resume from the same one).
        Returns what was done, for the job's log; StoreError when the store cannot say.
        A manifest whose objects are gone (pruned by another writer meanwhile) gives way
        to the one before."""
        with self._restoring:
            for manifest in layout.checkpoints_newest_first(self.store, self.job_id):
                try:
                    return self._restore(manifest, always=always)
                except _Stopped:
                    return None  # the attempt ended meanwhile: its folder is left as it was
                except ObjectMissing as exc:
                    log.warning(
                        "job %s: checkpoint incomplete, the one before: %s", self.job_id, exc
                    )
            return None

    def _restore(self, manifest: Manifest, *, always: bool) -> str | None:
        self.seq = manifest.seq  # the next manifest written here sorts after it
        local = scan(self.folder)
        mark = self._mark()
        if mark is not None and mark.files == local:  # nothing written here since its sync
            if mark.manifest == manifest.id:  # and that is the store's newest
                self._learn(manifest, local)
                return None
            # the store's is newer than anything this box has: it is downloaded below
        elif local and not always and _newest(local) > manifest.written_at:
            return (
                f"checkpoints: this box's are newer than the store's (written "
                f"{_clock(_newest(local))}, the store's {_clock(manifest.written_at)}): "
                "resuming from them, uploading them"
            )
        self._download(manifest)
        self._learn(manifest, scan(self.folder))
        total = sum(f.size for f in manifest.files)
        return (
            f"checkpoints: resuming from the store's newest ({len(manifest.files)} files, "
            f"{total / 1e6:.1f} MB, attempt {manifest.attempt})"
        )

    def _download(self, manifest: Manifest) -> None:
        """The manifest's files into a new folder beside the checkpoint folder, then that
        folder in its place: whole, or the old one left as it was. The new folder's name
        is made here, at random, and the folder created anew (mkdtemp): nothing the job
        left in its folder (a link named as a guess) is written through."""
        self.root.mkdir(parents=True, exist_ok=True)  # in jobs/, which only the worker changes
        staging = Path(tempfile.mkdtemp(prefix=".checkpoints-restore-", dir=self.root))
        try:
            for stored in manifest.files:
                if self._closed:  # the attempt ended meanwhile: nothing is swapped in
                    raise _Stopped
                target = staging / stored.name
                target.parent.mkdir(parents=True, exist_ok=True)  # below the new folder
                self.store.download(stored.key, target, stored.size)
            old = self.root / f".checkpoints-old-{uuid.uuid4().hex}"
            if self.folder.is_symlink() or self.folder.exists():
                os.replace(self.folder, old)  # a link is moved, not followed
            os.replace(staging, self.folder)
            if old.is_symlink():
                old.unlink()
            else:
                shutil.rmtree(old, ignore_errors=True)
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def _learn(self, manifest: Manifest, local: Snapshot) -> None:
        """The folder as the manifest names it: those versions need no upload."""
        keys = manifest.by_name()
        for name, version in local.items():
            if name in keys and keys[name].size == version.size:
                self.synced.keys[version] = keys[name].key
        self.synced.published = local
        self._remember(manifest, local)

    # The folder as this box last synced it, and the manifest that names it: a folder of
    # the same names and sizes as the store's newest may still be an older checkpoint
    # (weights always have the same shape); only this tells that it is that one.
    @property
    def _mark_path(self) -> Path:
        return self.root / f".checkpoints-synced-node{self.node}.json"

    def _mark(self) -> Mark | None:
        try:
            data = nofollow.read(self.root, self._mark_path, MARK_LIMIT)
            return None if data is None else Mark.model_validate_json(data)
        except (OSError, ValueError):  # a job's own writing, or none: no mark
            return None

    def _remember(self, manifest: Manifest, local: Snapshot) -> None:
        mark = Mark(manifest=manifest.id, files=local)
        try:
            nofollow.write(self.root, self._mark_path, mark.model_dump_json().encode())
        except OSError as exc:  # the next start downloads what it could have kept
            log.warning("job %s: could not note its synced checkpoints: %s", self.job_id, exc)

    # -- upload ---------------------------------------------------------------------------

    def start(self) -> CheckpointSync:
        """Watch the folder from now on; nothing, once the attempt has ended (it ended
        while its checkpoints were being restored, before it trained)."""
        with self._life:
            if not self._closed:
                self._thread = threading.Thread(
                    target=self._run, name=f"checkpoints-{self.job_id}", daemon=True
                )
                self._thread.start()
        return self

    def _end(self, join_s: float | None) -> threading.Thread | None:
        """Stop the thread (waiting at most ``join_s`` for an upload under way); the
        thread that ran, if one did."""
        with self._life:
            self._closed = True
            thread = self._thread
        self._stop.set()
        if thread is not None and join_s != 0:
            thread.join(join_s)
        return thread

    def _run(self) -> None:
        wait = self.interval_s
        while not self._stop.wait(wait):
            try:
                now = scan(self.folder)
                if not self._pending(now) or self._upload(now):
                    wait = self.interval_s
                    continue
            except Exception:  # whatever the job's folder holds, the next look comes
                log.exception("job %s: checkpoint upload failed", self.job_id)
            wait = min(max(wait * 2, RETRY_FIRST_S), RETRY_MOST_S)

    def flush(self, timeout_s: float) -> bool:
        """Stop the thread and upload the folder as the attempt left it, trying until
        ``timeout_s``: whether the store holds it now (an attempt that never started
        training wrote nothing to keep)."""
        deadline = time.monotonic() + timeout_s
        with self._life:
            self._closed = True  # a restore under way stops at its next file ...
        with self._restoring:  # ... and ends before anything here looks at the folder
            pass
        if self._end(join_s=timeout_s) is None:
            return True  # never started: its attempt did not train
        wait = RETRY_FIRST_S
        while True:
            if self._cancelled:
                return False
            now = scan(self.folder)
            if not self._pending(now):
                return True
            if self._upload(now):
                return True
            if time.monotonic() + wait > deadline:
                return False
            time.sleep(wait)
            wait = min(wait * 2, RETRY_MOST_S)

    def _pending(self, now: Snapshot) -> bool:
        """Whether the folder differs from what the store holds of it (an empty folder
        of a job that never checkpointed differs from nothing)."""
        if self.synced.published is None:
            return bool(now)
        return now != self.synced.published

    def close(self) -> None:
        """Publish nothing more (the lease is gone): an upload under way stops before its
        manifest. Returns at once (called from the supervisor's loop)."""
        self._cancelled = True
        self._end(join_s=0)

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def _upload(self, snapshot: Snapshot) -> bool:
        """The snapshot's new versions, then its manifest; whether it is in the store
        (False: the store failed, said once through ``on_trouble``; or the folder
        changed under the upload, tried again at the next look)."""
        with self._lock:
            try:
                files = []
                for name, version in sorted(snapshot.items()):
                    if self._cancelled:
                        return False
                    files.append(self._send(name, version))
                if any(f is None for f in files) or self._cancelled:
                    return False
                manifest = Manifest(
                    job_id=self.job_id,
                    attempt=self.attempt,
                    seq=self.seq + 1,
                    node=self.node,
                    written_at=time.time(),
                    files=[f for f in files if f is not None],
                )
                layout.publish_checkpoint(self.store, manifest)
                self.seq = manifest.seq
                self._remember(manifest, snapshot)
            except StoreError as exc:
                self._troubled(f"{exc}")
                return False
            except OSError as exc:  # the folder is the job's: a file swapped meanwhile
                log.info("job %s: checkpoint folder changed under its upload: %s", self.job_id, exc)
                return False
            self.synced.published = snapshot
            self._troubled(None)
            return True

    def _send(self, name: str, version: Version) -> StoredFile | None:
        """One file's version in the store (sent now, or earlier); None when the file is
        no longer that version."""
        key = self.synced.keys.get(version)
        if key is not None:
            return StoredFile(name=name, key=key, size=version.size)
        fd = nofollow.open_file(self.root, self.folder / name)
        try:
            if _version(fd) != version:
                return None  # replaced since the scan: the next look sends the new one
            key = layout.checkpoint_file_key(self.job_id, name)
            with os.fdopen(os.dup(fd), "rb") as file:  # boto3 closes what it is given
                self.store.put_file(key, file)
            if _version(fd) != version:  # written to in place meanwhile: what went up
                return None  # may be torn, and no manifest names it
        finally:
            os.close(fd)
        self.synced.keys[version] = key
        return StoredFile(name=name, key=key, size=version.size)

    def _troubled(self, why: str | None) -> None:
        """Say once that uploads wait, and once that they work again."""
        if why == self.trouble or (why is not None and self.trouble is not None):
            return
        self.trouble = why
        try:
            self.on_trouble(why)
        except Exception:  # the database may be away too: the log says it meanwhile
            log.exception("job %s: could not record the store's trouble", self.job_id)


# A name's bytes at most: its key (jobs/<id>/checkpoints/files/<uuid>/<name>) stays within
# S3's 1024 and the manifest's bound.
NAME_LIMIT = 900


def _storable(name: str) -> bool:
    """Whether a file's name can be a key: UTF-8 (not a byte the file system allows and
    JSON cannot carry) and short enough. Others are left on this box, said in the log."""
    try:
        fits = len(name.encode()) <= NAME_LIMIT
    except UnicodeEncodeError:
        fits = False
    if not fits:
        log.warning("checkpoint file %r: its name cannot be a key in the store: not uploaded", name)
    return fits


def _newest(snapshot: Snapshot) -> float:
    """When the newest file of a folder was written, in seconds since the epoch."""
    return max((v.mtime_ns for v in snapshot.values()), default=0) / 1e9


def _version(fd: int) -> Version:
    st = os.fstat(fd)
    return Version(st.st_ino, st.st_size, st.st_mtime_ns)


def _clock(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds))
