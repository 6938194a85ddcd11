"""The worker's copies of a job's blobs: code packages unpacked once per digest, data files
fetched once per digest, both read-only and shared by every job that names them.

On the box that serves the API the blob store is on this disk and is read in place. A
worker on another box (several boxes share one PostgreSQL database, not a filesystem)
fetches a blob by digest, verifies its SHA-256 and keeps it in its cache: from the object
store when there is one (the API copies blobs there), else, or when the store lacks it,
cannot be reached or holds other bytes, from the API.

    <cache_dir>/blobs/<hex>     fetched blobs (read-only)
    <cache_dir>/code/<hex>/     unpacked packages (read-only), see service.packages.unpack
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from service.blobs import BlobStore
from service.objects.layout import blob_key
from service.objects.store import ObjectStore, StoreError
from service.packages import PackageLimits, unpack
from service.reasons import ReasonCode
from service.settings import Settings
from workers.errors import NotRetryable

if TYPE_CHECKING:
    from workers.supervisor.cache_budget import Holds

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"

FETCH_CHUNK_BYTES = 2**20
FETCH_TIMEOUT_S = 60.0  # between two chunks, not for the whole blob


class BlobCache:
    """Blobs and unpacked packages on this worker's disk."""

    def __init__(
        self, settings: Settings, holds: Holds | None = None, objects: ObjectStore | None = None
    ) -> None:
        """``holds``: an attempt's, which then holds every cache entry it is given;
        ``objects``: the supervisor's object store, tried before the API."""
        self.settings = settings
        self.holds = holds
        self.objects = objects
        self.local = BlobStore.from_settings(settings)
        self.root = settings.cache_path
        self.api_url = settings.api_url or f"http://{_reachable(settings.host)}:{settings.port}"

    def blob(self, digest: str) -> Path:
        """A path to the blob's bytes on this disk, fetched first if needed."""
        local = self.local.path(digest)
        if local.is_file():
            return local.resolve()
        cached = self.root / "blobs" / digest.removeprefix("sha256:")
        if self.holds is not None:  # before it is fetched: not evicted meanwhile
            self.holds.hold("blobs", cached.name)
        if not cached.is_file():
            self._fetch(digest, cached)
        return cached

    def code(self, digest: str) -> Path:
        """The package unpacked (once per digest, read-only): a script job's working dir."""
        dest = self.root / "code" / digest.removeprefix("sha256:")
        if self.holds is not None:  # before it is unpacked: not evicted meanwhile
            self.holds.hold("code", dest.name)
        if dest.is_dir():
            return dest
        limits = PackageLimits.from_settings(self.settings)
        return unpack(
            self.blob(digest),
            dest,
            max_files=limits.max_files,
            max_unpacked_bytes=limits.max_unpacked_bytes,
        )

    def _fetch(self, digest: str, dest: Path) -> None:
        """The blob into ``dest``, whole and verified, or not at all: from the object store
        if it has it, else from the API."""
        dest.parent.mkdir(parents=True, exist_ok=True)
        if self.objects is not None and self._fetch_stored(self.objects, digest, dest):
            return
        self._fetch_from_api(digest, dest)

    def _fetch_stored(self, objects: ObjectStore, digest: str, dest: Path) -> bool:
        """Download the store's copy into ``dest`` if it is there, reachable, and holds the
        digest's bytes; whether it did (if not, the API is asked)."""
        key = blob_key(digest)
        fd, tmp_name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}-", suffix=".part")
        os.close(fd)
        tmp = Path(tmp_name)
        try:
            size = objects.size(key)
            if size is None:
                log.info("blob %s is not in %s: fetching it from the API", digest, objects)
                return False
            log.info("fetching blob %s from %s", digest, objects)
            objects.download(key, tmp, size)
            with tmp.open("rb") as file:
                got = f"sha256:{hashlib.file_digest(file, 'sha256').hexdigest()}"
                os.fsync(file.fileno())
            if got != digest:
                log.warning(
                    "blob %s in %s holds other bytes (%s): fetching it from the API",
                    digest,
                    objects,
                    got,
                )
                return False
            os.chmod(tmp, 0o444)
            os.replace(tmp, dest)
            return True
        except StoreError as exc:  # missing meanwhile, refused, or unreachable
            log.warning(
                "blob %s not fetched from %s (%s): fetching it from the API", digest, objects, exc
            )
            return False
        finally:
            tmp.unlink(missing_ok=True)

    def _fetch_from_api(self, digest: str, dest: Path) -> None:
        """GET the blob from the API into ``dest``, whole and verified, or not at all."""
        url = f"{self.api_url.rstrip('/')}/api/v1/blobs/{digest}/content"
        headers = {}
        if self.settings.api_token:
            headers["Authorization"] = f"Bearer {self.settings.api_token}"
        fd, tmp_name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}-", suffix=".part")
        tmp = Path(tmp_name)
        hasher = hashlib.sha256()
        log.info("fetching blob %s from %s", digest, self.api_url)
        try:
            with (
                os.fdopen(fd, "wb") as out,
                httpx.stream("GET", url, headers=headers, timeout=FETCH_TIMEOUT_S) as response,
            ):
                if response.status_code == 404:
                    raise NotRetryable(
                        ReasonCode.missing_input, f"blob {digest} is no longer stored"
                    )
                response.raise_for_status()
                for chunk in response.iter_bytes(FETCH_CHUNK_BYTES):
                    hasher.update(chunk)
                    out.write(chunk)
                out.flush()
                os.fsync(out.fileno())
            got = f"sha256:{hasher.hexdigest()}"
            if got != digest:  # retried: the next fetch may get the right bytes
                raise OSError(f"blob {digest} arrived with digest {got}")
            os.chmod(tmp, 0o444)
            os.replace(tmp, dest)
        finally:
            tmp.unlink(missing_ok=True)


def _reachable(host: str) -> str:
    """An address to reach a server bound to ``host`` on this box: a wildcard bind
    (0.0.0.0, ::) is not an address to connect to, and not a name the API answers to."""
    if host in ("0.0.0.0", "::", ""):
        return LOOPBACK
    return f"[{host}]" if ":" in host else host
