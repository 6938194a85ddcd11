"""Code packages: zip archives a job runs from, checked before anything is enqueued and
unpacked once per digest, read-only, into a cache that jobs share.

``check_package`` reads the central directory (names, types, declared sizes), then each
member's data through once per archive (a later submit naming it reads nothing), so a
package that lies about its sizes is refused at submit, not on every attempt of the job.
``unpack`` trusts none of it: it checks again, counts the bytes actually written, and
works in a temp directory renamed into place only when whole, so a cache entry is
complete or absent.
"""

from __future__ import annotations

import lzma
import os
import shutil
import stat
import tempfile
import threading
import zipfile
import zlib
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from service.errors import PackageInvalid
from service.settings import Settings

COPY_CHUNK_BYTES = 2**20
# The module at a package's root that defines its recipes, for a job that runs a recipe
# from its own code (workers.recipes.load_package_recipes imports it).
RECIPES_MODULE = "trainyard_recipes.py"
# Compression methods the standard library can read (3.11): anything else would only fail
# later, on the worker.
READABLE = {zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA}


@dataclass(frozen=True)
class PackageLimits:
    max_files: int
    max_unpacked_bytes: int
    max_bytes: int | None = None  # the archive itself

    @classmethod
    def from_settings(cls, settings: Settings) -> PackageLimits:
        """The operator's limits for code packages."""
        return cls(
            settings.max_package_files,
            settings.max_package_unpacked_bytes,
            settings.max_code_bytes,
        )


@dataclass(frozen=True)
class PackageSummary:
    files: int
    unpacked_bytes: int  # as the archive declares them
    names: frozenset[str]  # of its files


def check_package(
    path: Path, *, max_files: int, max_unpacked_bytes: int, max_bytes: int | None = None
) -> PackageSummary:
    """Refuse (PackageInvalid, naming the entry) an archive that is not a zip, too large,
    or holds a path out of its root, a link, a device, or too many files or bytes; or a
    member whose data is not what the archive declares (its size, its CRC), which would
    fail on every worker that unpacked it."""
    summary = _check_directory(
        path, max_files=max_files, max_unpacked_bytes=max_unpacked_bytes, max_bytes=max_bytes
    )
    _check_data(path)
    return summary


def _check_directory(
    path: Path, *, max_files: int, max_unpacked_bytes: int, max_bytes: int | None = None
) -> PackageSummary:
    """``check_package``'s look at the central directory alone."""
    if max_bytes is not None and path.stat().st_size > max_bytes:
        raise PackageInvalid(
            f"archive larger than {max_bytes} bytes (the limit set by TRAINYARD_MAX_CODE_BYTES)"
        )
    try:
        with zipfile.ZipFile(path) as archive:
            infos = archive.infolist()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError) as exc:
        raise PackageInvalid(f"not a readable zip archive ({exc})") from exc
    seen: set[str] = set()
    files = declared = 0
    for info in infos:
        _check_entry(info, seen)
        if info.is_dir():
            continue
        files += 1
        declared += info.file_size
        if files > max_files:
            raise PackageInvalid(
                f"more than {max_files} files (the limit set by TRAINYARD_MAX_PACKAGE_FILES)",
                info.filename,
            )
        if declared > max_unpacked_bytes:
            raise PackageInvalid(
                f"unpacked size passes {max_unpacked_bytes} bytes "
                "(the limit set by TRAINYARD_MAX_PACKAGE_UNPACKED_BYTES)",
                info.filename,
            )
    _check_parents(infos)
    return PackageSummary(files, declared, frozenset(i.filename for i in infos if not i.is_dir()))


# Archives whose data was read whole and found as declared, by (path, inode, size, mtime):
# a blob never changes under its digest, so each is read once per process, not per submit.
_VERIFIED: OrderedDict[tuple[str, int, int, int], None] = OrderedDict()
_VERIFIED_MAX = 1024
_VERIFIED_LOCK = threading.Lock()


def _check_data(path: Path) -> None:
    """Read every member through (nothing is written), as ``unpack`` will: a member that
    holds more or fewer bytes than declared, or whose CRC is wrong, is refused. Run after
    ``_check_directory``, so at most the declared (and allowed) bytes are read."""
    st = path.stat()
    key = (str(path), st.st_ino, st.st_size, st.st_mtime_ns)
    with _VERIFIED_LOCK:
        if key in _VERIFIED:
            _VERIFIED.move_to_end(key)
            return
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            if not info.is_dir():
                _copy(archive, info, None, info.file_size)
    with _VERIFIED_LOCK:
        _VERIFIED[key] = None
        while len(_VERIFIED) > _VERIFIED_MAX:
            _VERIFIED.popitem(last=False)


def _check_parents(infos: list[zipfile.ZipInfo]) -> None:
    # "a" as a file and "a/b" beside it cannot both be unpacked.
    files = {i.filename for i in infos if not i.is_dir()}
    for name in files:
        parts = name.split("/")
        for depth in range(1, len(parts)):
            if "/".join(parts[:depth]) in files:
                raise PackageInvalid("its parent directory is a file in the package", name)


def _check_entry(info: zipfile.ZipInfo, seen: set[str]) -> None:
    name = info.filename
    # zipfile turns a Windows-made archive's backslashes into slashes; a backslash still
    # here is part of a name, which Windows tools would read as a path separator.
    if "\\" in name or "\x00" in name:
        raise PackageInvalid("a backslash or NUL in the name", name)
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        raise PackageInvalid("an absolute path", name)
    parts = name.rstrip("/").split("/")
    if ".." in parts:
        raise PackageInvalid("a path that leaves the package's root (..)", name)
    if not name.rstrip("/") or any(p in ("", ".") for p in parts):
        raise PackageInvalid("an empty or '.' path component", name)
    kind = stat.S_IFMT(info.external_attr >> 16)  # Unix mode bits; 0 from other systems
    if kind == stat.S_IFLNK:
        raise PackageInvalid("a symbolic link", name)
    if kind not in (0, stat.S_IFREG, stat.S_IFDIR):
        raise PackageInvalid("not a regular file or directory (device, FIFO or socket)", name)
    if info.flag_bits & 0x1:
        raise PackageInvalid("encrypted", name)
    if info.compress_type not in READABLE:
        raise PackageInvalid(f"compression method {info.compress_type} is not supported", name)
    key = name.rstrip("/")
    if key in seen:
        raise PackageInvalid("appears twice", name)
    seen.add(key)


def unpack(path: Path, dest: Path, *, max_files: int, max_unpacked_bytes: int) -> Path:
    """Unpack the archive at ``dest`` (read-only), once: an existing ``dest`` is returned
    as it is. Checked again on the way, by the bytes written, not the sizes declared."""
    if dest.is_dir():
        return dest
    # The data is checked as it is written (a worker never trusts the API's look at it).
    _check_directory(path, max_files=max_files, max_unpacked_bytes=max_unpacked_bytes)
    dest.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}-", suffix=".part"))
    try:
        with zipfile.ZipFile(path) as archive:
            written = 0
            for info in archive.infolist():
                target = work / info.filename
                if info.is_dir():
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                written += _extract(archive, info, target, max_unpacked_bytes - written)
        _make_read_only(work)
        try:
            os.rename(work, dest)  # same parent: atomic, and needs no write on work itself
        except OSError:
            if not dest.is_dir():
                raise
            # Another process unpacked the same digest first: theirs stands.
            _remove_tree(work)
        return dest
    except BaseException:
        _remove_tree(work)
        raise


def _extract(archive: zipfile.ZipFile, info: zipfile.ZipInfo, target: Path, room: int) -> int:
    """Copy one entry, stopping as soon as it passes its declared size or the room left."""
    with open(target, "xb") as out:
        written = _copy(archive, info, out, room)
    mode = 0o555 if (info.external_attr >> 16) & 0o111 else 0o444
    os.chmod(target, mode)
    return written


def _copy(archive: zipfile.ZipFile, info: zipfile.ZipInfo, out: BinaryIO | None, room: int) -> int:
    """Read one entry whole (into ``out``, if given): PackageInvalid as soon as it passes
    its declared size or ``room``, or if it is damaged (fewer bytes, a wrong CRC)."""
    allowed = min(info.file_size, room)
    written = 0
    try:
        with archive.open(info) as source:
            while chunk := source.read(COPY_CHUNK_BYTES):
                written += len(chunk)
                if written > allowed:
                    raise PackageInvalid("holds more bytes than it declares", info.filename)
                if out is not None:
                    out.write(chunk)
    except (zipfile.BadZipFile, EOFError, zlib.error, lzma.LZMAError) as exc:
        # zipfile stops at the declared size and then finds the CRC wrong: the same lie.
        raise PackageInvalid(f"damaged or not as declared ({exc})", info.filename) from exc
    except OSError as exc:
        if exc.errno is not None:  # the disk, not the archive
            raise
        raise PackageInvalid(f"damaged ({exc})", info.filename) from exc  # bz2's own error
    if written < info.file_size:
        raise PackageInvalid(
            f"holds {written} bytes, not the {info.file_size} it declares", info.filename
        )
    return written


def _make_read_only(root: Path) -> None:
    # Files are made read-only as they are written; directories last, deepest first.
    for directory, _subdirs, _files in os.walk(root, topdown=False):
        os.chmod(directory, 0o555)


def _remove_tree(root: Path) -> None:
    """Remove a tree whose directories may be read-only."""
    if not root.exists():
        return
    for directory, _subdirs, _files in os.walk(root):
        os.chmod(directory, 0o755)
    shutil.rmtree(root)
