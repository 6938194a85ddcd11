"""The worker's cache kept to a size: unpacked packages, fetched blobs and requirement
virtualenvs (``<cache_dir>/code``, ``blobs``, ``venvs``), the least recently used evicted
once they pass TRAINYARD_CACHE_BUDGET_GB, never one a running attempt uses; and no job
taken while the disk has less than TRAINYARD_MIN_FREE_DISK_GB free.

- **Holds.** The supervisor holds every entry an attempt uses, from before it is fetched,
  unpacked or built until the attempt ends: a shared ``flock`` on a file of the entry's
  in ``<cache_dir>/.holds``. An eviction takes it exclusively without waiting, so a held
  entry is never removed, by this worker or another sharing the cache; a lock is its
  process's, so no hold outlives a worker that crashed. The job's processes (another
  account) hold nothing: the supervisor knows what each attempt reads, and the key of
  its virtualenv.
- **The index.** ``<cache_dir>/.index.json``: each entry's bytes, measured once, when it
  is first seen whole, and when an attempt last used it (its hold's start or end). A
  sweep lists three folders and reads this file; it walks only entries not measured yet.
- **Removal** never follows a link (a job's account wrote into its virtualenv), and a
  virtualenv goes only under its requirement set's lock, never while one builds it.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shutil
import stat
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from service.settings import Settings
from workers import venv_names
from workers.supervisor import nofollow

log = logging.getLogger(__name__)

GIB = 2**30
KINDS = ("code", "blobs", "venvs")
# With nothing made or let go since the last sweep, the next is this long after it: for
# entries another worker sharing the cache made, or a disk filled from elsewhere.
SWEEP_INTERVAL_S = 30.0
# A sweep stops evicting after this long and goes on before the next claim: the loop that
# runs it also renews the running jobs' leases.
SWEEP_SLICE_S = 2.0
INDEX = ".index.json"
HOLDS = ".holds"
# A walk that measures an entry stops counting after this many files (a job's account may
# fill its virtualenv with millions, and the walk runs on the loop that renews leases):
# the entry is then known by what was counted, a size it has at least.
MEASURE_MAX_FILES = 100_000

Index = dict[str, dict[str, float]]  # entry ("code/<hex>") -> {"bytes", "used"}


class CacheBudget:
    """The cache's index, holds and sweeps, for one supervisor (its threads share it)."""

    def __init__(self, settings: Settings) -> None:
        self.root = settings.cache_path
        self.data_dir = settings.data_dir.resolve()
        self.budget_bytes = int(settings.cache_budget_gb * GIB)
        self.min_free_bytes = int(settings.min_free_disk_gb * GIB)
        self.refusing: str | None = None  # why no job starts here now
        self._lock = threading.Lock()  # the index, between the loop and hand-off threads
        self._dirty = True  # an entry was made or let go since the last sweep
        self._due = 0.0  # monotonic: the next sweep even so
        self._size = (0, 0)  # bytes, entries: as of the last sweep
        self._free = 0

    def holds(self) -> Holds:
        """An attempt's holds, none yet."""
        return Holds(self)

    def upkeep(self) -> str | None:
        """Before a claim: sweep when an entry was made or let go (or every
        SWEEP_INTERVAL_S, or when the disk just ran short); and why no job may start here
        (its disk nearly full), or None. Cheap when nothing changed: one statvfs."""
        now = time.monotonic()
        free, where = self._disk()
        short = free < self.min_free_bytes
        if self._dirty or now >= self._due or (short and self.refusing is None):
            try:
                self.sweep()
            except OSError:  # the disk's room is still checked; the cache is swept next time
                log.exception("the cache %s could not be swept", self.root)
            free, where = self._disk()
            short = free < self.min_free_bytes
        self._free = free
        reason = None
        if short:
            reason = (
                f"the disk holding {where} has {free / GIB:.1f} GiB free, under "
                f"TRAINYARD_MIN_FREE_DISK_GB={self.min_free_bytes / GIB:g} even with every "
                "cache entry no running job uses evicted: taking no job until there is room"
            )
        if (reason is None) != (self.refusing is None):  # said once, not at every GiB
            if reason is not None:
                log.warning("taking no job: %s", reason)
            else:
                log.info("the disk has room again (%.1f GiB free): taking jobs", free / GIB)
        self.refusing = reason
        return reason

    def record(self) -> dict[str, Any]:
        """What ``/api/v1/workers`` shows of the cache (``worker.cache``)."""
        size, entries = self._size
        return {
            "size_bytes": size,
            "budget_bytes": self.budget_bytes,
            "entries": entries,
            "disk_free_bytes": self._free,
            "min_free_bytes": self.min_free_bytes,
            "refusing": self.refusing,
        }

    def sweep(self) -> None:
        """Measure the entries not measured yet, then evict the least recently used that no
        one holds while the cache is over its budget or the disk short of room."""
        self._dirty = False
        started = time.monotonic()
        self._due = started + SWEEP_INTERVAL_S
        with self._lock, self._index() as index:
            there = self._listing()
            for gone in set(index) - set(there):
                del index[gone]
            for entry in there.keys() - index.keys():
                try:
                    measured = self._measure_unheld(entry)
                except OSError as exc:  # one entry's trouble is not the whole sweep's
                    log.warning("cache entry %s not measured: %s", entry, exc)
                    continue
                if measured is not None:
                    index[entry] = measured
            total = sum(int(e["bytes"]) for e in index.values())
            for entry in sorted(index, key=lambda e: index[e]["used"]):
                room = _free_bytes(self.root) >= self.min_free_bytes  # what evicting frees
                if total <= self.budget_bytes and room:
                    break
                if time.monotonic() - started > SWEEP_SLICE_S:
                    self._dirty = True  # the rest before the next claim
                    break
                if self._evict(entry, index[entry]):
                    total -= int(index.pop(entry)["bytes"])
            self._size = (total, len(index))

    def used(self, entries: list[str], *, measure: bool) -> None:
        """Entries an attempt uses now; ``measure``: they are whole, measure the new ones."""
        now = time.time()
        sizes: dict[str, int] = {}
        if measure:
            with self._lock, self._index() as index:
                new = [e for e in entries if e not in index and os.path.lexists(self.root / e)]
            # outside the locks: a package's walk must not hold up the loop's sweep
            sizes = {entry: _measure(self.root / entry) for entry in new}
        with self._lock, self._index() as index:
            for entry in entries:
                if entry in index:
                    index[entry]["used"] = now
                elif entry in sizes:
                    index[entry] = {"bytes": sizes[entry], "used": now}
        self._dirty = self._dirty or measure

    # --- holds, on files of their own -------------------------------------------------

    def lock_entry(self, entry: str, how: int) -> int | None:
        """A descriptor holding ``entry``'s hold file locked ``how`` (fcntl.LOCK_SH or
        LOCK_EX, with LOCK_NB: None while another holds it)."""
        path = self._hold_file(entry)
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, how)
            except BlockingIOError:
                os.close(fd)
                return None
            # An eviction removes the file it locked: lock the one there now instead.
            try:
                if os.stat(path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino:
                    return fd
            except FileNotFoundError:
                pass
            os.close(fd)

    def _hold_file(self, entry: str) -> Path:
        """The file an entry's hold locks: named by its hash, as an entry's own name is
        whatever a job's account made in ``venvs`` (a name too long for a file's, say)."""
        return self.root / HOLDS / hashlib.sha256(entry.encode()).hexdigest()[:32]

    # --- the sweep's steps --------------------------------------------------------------

    @contextmanager
    def _index(self) -> Iterator[Index]:
        """The index, read and written back whole under a lock (workers may share a cache)."""
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.root / INDEX
        fd = os.open(self.root / f"{INDEX}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                index: Index = json.loads(path.read_text())
            except (OSError, ValueError):  # none yet, or cut short: measured again
                index = {}
            yield index
            tmp = path.with_name(f"{INDEX}.tmp-{os.getpid()}")
            tmp.write_text(json.dumps(index))
            os.replace(tmp, path)
        finally:
            os.close(fd)

    def _listing(self) -> dict[str, Path]:
        """Every entry on disk: names only, no walk (a dot-name is being made, or a lock)."""
        found = {}
        for kind in KINDS:
            for name in nofollow.listdir(self.root, self.root / kind):
                if not name.startswith(".") and not name.endswith(".lock"):
                    found[f"{kind}/{name}"] = self.root / kind / name
        return found

    def _measure_unheld(self, entry: str) -> dict[str, float] | None:
        """An entry found on disk but not in the index (from before, or another worker's),
        measured once, last used when it was made; None while it is held (being made).
        Measured under its hold's lock, taken exclusively: no one makes it anew meanwhile."""
        fd = self.lock_entry(entry, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if fd is None:
            return None
        try:
            path = self.root / entry
            return {"bytes": _measure(path), "used": path.lstat().st_mtime}
        except OSError:  # gone meanwhile
            return None
        finally:
            os.close(fd)

    def _evict(self, entry: str, known: dict[str, float]) -> bool:
        """Remove an entry no one holds, under its hold's lock (and a virtualenv under its
        requirement set's too); False if held, being built, or not removable."""
        try:
            fd = self.lock_entry(entry, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            log.warning("cache entry %s not evicted: %s", entry, exc)
            return False
        if fd is None:
            return False
        kind, name = entry.split("/")
        try:
            if kind == "venvs":
                with venv_names.lock_if_free(self.root / "venvs", name) as free:
                    if not free:
                        return False
                    _remove(self.root / kind, name)
            else:
                _remove(self.root / kind, name)
            os.unlink(self._hold_file(entry))  # locked: see lock_entry
        except OSError as exc:
            log.warning("cache entry %s not evicted: %s", entry, exc)
            return False
        finally:
            os.close(fd)
        idle = time.time() - known["used"]
        log.info(
            "evicted %s from the cache (%.1f MiB, last used %.0fs ago)",
            entry,
            known["bytes"] / 2**20,
            idle,
        )
        return True

    def _disk(self) -> tuple[int, Path]:
        """The free bytes of the fuller of the cache's and the data directory's disks."""
        return min((_free_bytes(folder), folder) for folder in (self.root, self.data_dir))


class Holds:
    """One attempt's holds on cache entries: taken as its inputs are placed, let go when
    it ends (or with the worker's process). Its hand-off thread and the loop share it."""

    def __init__(self, budget: CacheBudget) -> None:
        self.budget = budget
        self._fds: dict[str, int] = {}
        self._lock = threading.Lock()
        self._released = False

    def hold(self, kind: str, name: str) -> None:
        """Hold ``kind/name`` until the attempt ends: it is not evicted meanwhile (this may
        wait for an eviction of it under way, after which it is made anew)."""
        entry = f"{kind}/{name}"
        with self._lock:
            if self._released or entry in self._fds:
                return
        fd = self.budget.lock_entry(entry, fcntl.LOCK_SH)
        assert fd is not None  # it waits
        with self._lock:
            if self._released or entry in self._fds:  # ended meanwhile: it uses nothing
                os.close(fd)
                return
            self._fds[entry] = fd
        self.budget.used([entry], measure=False)

    def hold_venv(self, requirements: list[str] | None, package: Path) -> None:
        """Hold the virtualenv a script job's runner uses (or builds) for its requirements."""
        try:
            lines = venv_names.requirement_lines(requirements, package)
            key = venv_names.venv_key(lines, package) if lines else None
        except Exception as exc:  # the runner reads them too, and says what is wrong
            log.info("%s: requirements not read here (%s): no virtualenv held", package, exc)
            return
        if key is not None:
            self.hold("venvs", key)

    def settle(self) -> None:
        """The entries held so far are whole: measure those new to the index."""
        with self._lock:
            entries = list(self._fds)
        self.budget.used(entries, measure=True)

    def release(self) -> None:
        """The attempt ended: measure what it made (its virtualenv), and let all go."""
        with self._lock:
            self._released = True
            fds, self._fds = self._fds, {}
        try:
            self.budget.used(list(fds), measure=True)
        finally:
            for fd in fds.values():
                os.close(fd)


def _free_bytes(folder: Path) -> int:
    """Bytes free to this account on ``folder``'s disk (of the folder above, if not made)."""
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    st = os.statvfs(folder)
    return st.f_bavail * st.f_frsize


class _Counted(Exception):
    """MEASURE_MAX_FILES files counted: the walk stops."""


def _measure(path: Path) -> int:
    """Bytes on disk of a file, or of a folder and everything in it, never through a link
    (of its first MEASURE_MAX_FILES files)."""
    st = path.lstat()
    if not stat.S_ISDIR(st.st_mode):
        return st.st_blocks * 512
    total = 0
    files = 0

    def add(fd: int, name: str | None) -> None:
        nonlocal total, files
        files += 1
        if files > MEASURE_MAX_FILES:
            raise _Counted
        if name is None:
            total += os.fstat(fd).st_blocks * 512
        else:
            with suppress(FileNotFoundError):  # gone meanwhile
                total += os.stat(name, dir_fd=fd, follow_symlinks=False).st_blocks * 512

    with suppress(_Counted):
        nofollow.walk(path, add)
    return total


def _remove(folder: Path, name: str) -> None:
    """Remove ``folder/name``, a file or a tree whose folders may be read-only (a package
    is unpacked so), never through a link."""
    path = folder / name
    if not stat.S_ISDIR(path.lstat().st_mode):
        nofollow.unlink(folder, path)
        return

    def writable(fd: int, name: str | None) -> None:
        if name is None and os.fstat(fd).st_mode & 0o700 != 0o700:
            os.fchmod(fd, os.fstat(fd).st_mode | 0o700)

    nofollow.walk(path, writable)
    parent = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        shutil.rmtree(name, dir_fd=parent)  # fd-based: a link in the tree is removed, not followed
    finally:
        os.close(parent)
