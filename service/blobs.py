"""The blob store: content-addressed files on disk, how they arrive, and how they go.

A blob lives at ``<blobs_dir>/sha256/<hex>`` (``blobs_dir`` defaults to
``<data_dir>/blobs``). An upload streams into ``<blobs_dir>/tmp/`` while it is hashed and
counted, is fsynced, and only then, if its digest is the one it was sent under, renamed
into place: ``tmp/`` and ``sha256/`` share a filesystem, so the rename is atomic and no
reader ever sees half a blob. Every failure (mismatch, over the limit, a full disk, a
client that went away, a cancelled request) removes the temp file. Rows are
``service.blob_rows``'s; ``service.blob_upkeep`` deletes and sweeps both. With an object
store, a stored blob is copied there too (``blobs/sha256/<hex>``), where workers on other
boxes fetch it from.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import os
import tempfile
from collections.abc import AsyncIterable
from dataclasses import dataclass
from pathlib import Path

import anyio
import anyio.to_thread

from service.errors import (
    BlobDigestMismatch,
    BlobStorageFull,
    BlobTooLarge,
)
from service.objects.layout import blob_key
from service.objects.store import ObjectStore
from service.settings import Settings

MAX_BLOB_SETTING = "TRAINYARD_MAX_BLOB_BYTES"
# Bytes received before they are handed, in one hop, to a worker thread that hashes and
# writes them while the next batch arrives. Measured (benchmarks.upload, 512 MiB, 2
# cores): 256 KiB 423 MiB/s, 1 MiB 585, 4 MiB 439; a request holds at most two batches.
BATCH_BYTES = 2**20
# Buffers per writev: the kernel takes at most IOV_MAX (1024) at once.
BATCH_CHUNKS = 512
# A temp file this old belongs to no upload still running (one would have touched it).
STALE_TEMP_S = 3600.0
_DISK_FULL = {errno.ENOSPC, errno.EDQUOT}


@dataclass(frozen=True)
class Received:
    digest: str
    size: int
    created: bool  # False: the blob was stored already; nothing new was kept


class BlobStore:
    """The blob files under one root directory."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.files = root / "sha256"
        self.tmp = root / "tmp"

    @classmethod
    def from_settings(cls, settings: Settings) -> BlobStore:
        """The store at ``blobs_dir``, or ``<data_dir>/blobs``."""
        return cls(settings.blobs_path)

    def path(self, digest: str) -> Path:
        """Where the blob's file is (whether or not it is there)."""
        return self.files / digest.removeprefix("sha256:")

    def size_of(self, digest: str) -> int | None:
        """The stored file's size, or None when there is none."""
        try:
            return self.path(digest).stat().st_size
        except FileNotFoundError:
            return None

    async def receive(
        self,
        chunks: AsyncIterable[bytes],
        digest: str,
        limit: int,
        setting: str = MAX_BLOB_SETTING,
        *,
        prove: bool = False,
    ) -> Received:
        """Store the streamed bytes as ``digest`` if they hash to it and fit in ``limit``.

        Holds at most two batches (one being written, one arriving); hashing and writing
        run in a worker thread (both release the GIL), so the event loop only moves
        chunks. A blob already stored is answered without reading the stream, unless
        ``prove``: then the sender must send the bytes, which are hashed and dropped (a
        digest alone proves nothing: it is not a secret)."""
        final = self.path(digest)
        try:
            os.utime(final)  # a sweep judges files without a row by their age
            if not prove:
                return Received(digest, final.stat().st_size, created=False)
        except FileNotFoundError:
            pass  # not stored (or deleted just now): receive it
        self.files.mkdir(parents=True, exist_ok=True)
        self.tmp.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=self.tmp, prefix=final.name[:16] + "-", suffix=".part")
        tmp = Path(name)
        hasher = hashlib.sha256()
        writer = _Writer(fd, hasher)
        size = 0
        batch: list[bytes] = []
        batched = 0
        try:
            async for chunk in chunks:
                size += len(chunk)
                if size > limit:  # counted, not declared: chunked bodies have no length
                    raise BlobTooLarge(limit, setting)
                batch.append(chunk)
                batched += len(chunk)
                if batched >= BATCH_BYTES or len(batch) >= BATCH_CHUNKS:
                    await writer.put(batch)
                    batch, batched = [], 0
            await writer.put(batch)
            await writer.wait()
            got = "sha256:" + hasher.hexdigest()
            if got != digest:
                raise BlobDigestMismatch(digest, got)
            created = await anyio.to_thread.run_sync(_install, fd, tmp, final)
            return Received(digest, size, created)
        except OSError as exc:
            if exc.errno in _DISK_FULL:
                raise BlobStorageFull(
                    f"no space left for blobs in {self.root}: nothing was kept"
                ) from exc
            raise
        finally:
            # Every path, the successful rename included (then there is no temp file left
            # to remove): a mismatch, the limit, a full disk, a disconnect, a cancellation.
            await writer.settle()
            os.close(fd)
            tmp.unlink(missing_ok=True)

    def copy_to(self, objects: ObjectStore, digest: str) -> bool:
        """Upload the blob's file to the object store unless it holds it already; whether
        it did. Blocking (boto3): run it in a thread. ``StoreError`` when the store refuses
        or cannot be reached, ``FileNotFoundError`` when the blob was deleted meanwhile."""
        path = self.path(digest)
        size = path.stat().st_size
        key = blob_key(digest)
        if objects.size(key) == size:  # taken for these bytes: workers verify what they fetch
            return False
        with path.open("rb") as file:
            objects.put_file(key, file)
        return True

    def remove(self, digest: str) -> None:
        """Delete the blob's file, if any."""
        self.path(digest).unlink(missing_ok=True)

    def remove_stale_temps(self, before: float) -> int:
        """Delete temp files last written before ``before`` (Unix seconds): left by a
        process that was killed mid-upload. How many went."""
        return sum(_unlink_if_older(entry, before) for entry in _scan(self.tmp))

    def files_older_than(self, before: float) -> list[str]:
        """Digests of the stored files last written before ``before`` (Unix seconds)."""
        return [
            "sha256:" + entry.name
            for entry in _scan(self.files)
            if entry.is_file() and entry.stat().st_mtime < before
        ]


class _Writer:
    """Hashes and writes batches in a worker thread, in order and one at a time, while the
    event loop receives the next batch: the two overlap instead of taking turns (awaiting
    each 4 MiB batch instead gave 243 MiB/s where this gives 440-585, benchmarks.upload).
    Written for asyncio, which uvicorn runs the app on."""

    def __init__(self, fd: int, hasher: hashlib._Hash) -> None:
        self.fd = fd
        self.hasher = hasher
        self.pending: asyncio.Future[None] | None = None

    async def put(self, batch: list[bytes]) -> None:
        """Start on ``batch`` once the batch before it is written."""
        await self.wait()
        if batch:
            work = anyio.to_thread.run_sync(_absorb, self.fd, self.hasher, batch)
            self.pending = asyncio.ensure_future(work)

    async def wait(self) -> None:
        """Until the batch in flight is written; raises what writing it raised."""
        if self.pending is not None:
            # Shielded: a cancelled request must not leave a thread writing unawaited.
            await asyncio.shield(self.pending)
            self.pending = None

    async def settle(self) -> None:
        """On every way out, before the file is closed: no thread is left writing to it."""
        if self.pending is not None:
            with anyio.CancelScope(shield=True):
                await asyncio.wait([self.pending])
            if not self.pending.cancelled():
                self.pending.exception()  # retrieved: asyncio logs an error never retrieved
            self.pending = None


def _absorb(fd: int, hasher: hashlib._Hash, batch: list[bytes]) -> None:
    # In a worker thread: sha256 and writev release the GIL for buffers this size.
    for chunk in batch:
        hasher.update(chunk)
    _write_all(fd, batch)


def _install(fd: int, tmp: Path, final: Path) -> bool:
    """fsync the temp file and rename it into place; False if the blob got there first."""
    os.fsync(fd)
    os.fchmod(fd, 0o444)  # content-addressed: never to change
    if final.exists():  # an upload of the same bytes finished first: keep one copy
        return False
    os.replace(tmp, final)
    _fsync_dir(final.parent)  # the rename itself survives a crash
    return True


def _write_all(fd: int, chunks: list[bytes]) -> None:
    """Write every byte of ``chunks`` (writev may write fewer, e.g. as the disk fills)."""
    total = sum(map(len, chunks))
    done = os.writev(fd, chunks)
    if done < total:
        rest = memoryview(b"".join(chunks))[done:]
        while rest:
            rest = rest[os.write(fd, rest) :]


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _scan(directory: Path) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(directory) as entries:
            return list(entries)
    except FileNotFoundError:
        return []


def _unlink_if_older(entry: os.DirEntry[str], before: float) -> bool:
    try:
        if entry.stat().st_mtime >= before:
            return False
        os.unlink(entry.path)
        return True
    except FileNotFoundError:  # its upload just finished or failed: not ours to count
        return False
