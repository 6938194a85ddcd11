"""Files in a job's folder, as the supervisor touches them: never through a link.

A job's account owns its folder while an attempt runs. It may plant a symbolic link
there, or swap a folder for one while the supervisor walks it; a supervisor running as
root that followed one would read, write, chown or chmod a file of the box's in its
place (the job's "environment record" pointing at a credentials file, say, stored and
shown to every user). So every path below a job's folder is opened one component at a
time, relative to its parent's descriptor, with ``O_NOFOLLOW``: a link anywhere on the
way is an error, never a detour. The job's folder itself sits in ``jobs/``, which only
the worker can change.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# What a job may have done to an entry since it was listed: removed it, or put a link (or
# a file) in a folder's place. Anything else (no descriptors left, say) is an error.
_GONE_OR_A_LINK = (errno.ENOENT, errno.ELOOP, errno.ENOTDIR)


@contextmanager
def _parent(root: Path, relative: Path) -> Iterator[int]:
    """A descriptor of ``relative``'s folder below ``root``, reached without a link."""
    fd = os.open(root, _DIR)
    try:
        for part in relative.parts[:-1]:
            below = os.open(part, _DIR, dir_fd=fd)
            os.close(fd)
            fd = below
        yield fd
    finally:
        os.close(fd)


def read(root: Path, path: Path, limit: int, offset: int = 0) -> bytes | None:
    """At most ``limit`` bytes of ``path`` (below ``root``) from ``offset``; None when it is
    not there. A link on the way, or in its place: OSError (ELOOP)."""
    relative = path.relative_to(root)
    # O_NONBLOCK: a FIFO in its place would block the open (and the supervisor) forever
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        with _parent(root, relative) as parent:
            fd = os.open(relative.name, flags, dir_fd=parent)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, f"{path} is not a regular file")
        os.set_blocking(fd, True)
        f.seek(offset)
        return f.read(limit)


def open_file(root: Path, path: Path) -> int:
    """A descriptor of the regular file ``path`` (below ``root``), for reading. A link on
    the way or in its place: OSError (ELOOP); anything but a regular file: OSError."""
    relative = path.relative_to(root)
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    with _parent(root, relative) as parent:
        fd = os.open(relative.name, flags, dir_fd=parent)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, f"{path} is not a regular file")
    os.set_blocking(fd, True)
    return fd


def write(root: Path, path: Path, data: bytes, owner: tuple[int, int] | None = None) -> None:
    """``path`` (below ``root``) whole, by a new file renamed over it (a link in its place
    is replaced, not followed); ``owner``: the (uid, gid) it is given."""
    relative = path.relative_to(root)
    tmp = f".{relative.name}.tmp-{os.getpid()}"
    with _parent(root, relative) as parent:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=parent)  # whatever a job left there: an entry, not a target
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(tmp, flags, 0o600, dir_fd=parent)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if owner is not None:
                os.fchown(f.fileno(), *owner)
        os.replace(tmp, relative.name, src_dir_fd=parent, dst_dir_fd=parent)


def unlink(root: Path, path: Path) -> None:
    """Remove ``path`` (below ``root``) if it is there; a link is removed, not followed."""
    relative = path.relative_to(root)
    try:
        with _parent(root, relative) as parent:
            os.unlink(relative.name, dir_fd=parent)
    except FileNotFoundError:
        pass


def place_links(root: Path, folder: Path, links: dict[str, Path]) -> None:
    """``folder`` (below ``root``) holding exactly ``links`` (name -> target), made anew:
    whatever was there is removed (a link removed, never followed), and the folder and
    those above it are made where missing, a link or file in their place removed first."""
    fd = os.open(root, _DIR)
    try:
        for part in folder.relative_to(root).parts:
            try:
                below = os.open(part, _DIR, dir_fd=fd)
            except OSError as exc:
                if exc.errno not in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR):
                    raise
                if exc.errno != errno.ENOENT:
                    os.unlink(part, dir_fd=fd)  # the job's link or file: an entry, not a way
                os.mkdir(part, 0o700, dir_fd=fd)
                below = os.open(part, _DIR, dir_fd=fd)
            os.close(fd)
            fd = below
        for name in os.listdir(fd):  # what an earlier attempt placed, or the job did
            try:
                os.unlink(name, dir_fd=fd)
            except IsADirectoryError:
                shutil.rmtree(name, dir_fd=fd)  # resists links swapped in meanwhile
        for name, target in links.items():
            tmp = f".{name}.tmp-{os.getpid()}"
            os.symlink(target, tmp, dir_fd=fd)
            os.replace(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
    finally:
        os.close(fd)


def listdir(root: Path, folder: Path) -> list[str]:
    """The names in ``folder`` (below ``root``, or ``root`` itself); none when it is not
    there. A link on the way or in its place: OSError (ELOOP)."""
    try:
        if folder == root:
            fd = os.open(root, _DIR)
        else:
            relative = folder.relative_to(root)
            with _parent(root, relative) as parent:
                fd = os.open(relative.name, _DIR, dir_fd=parent)
    except FileNotFoundError:
        return []
    try:
        return os.listdir(fd)
    finally:
        os.close(fd)


def walk(root: Path, visit: Callable[[int, str | None], None]) -> None:
    """Call ``visit(dir_fd, None)`` for every folder (``root`` first, each before what it
    holds) and ``visit(dir_fd, name)`` for everything else in it, links included (``visit``
    must not follow them), never through a link: a folder swapped for a link meanwhile is
    skipped. One descriptor per level is open at a time, however wide the tree."""
    top = os.open(root, _DIR)
    stack: list[tuple[int, Iterator[str]]] = [(top, iter(()))]  # what is open, by level
    try:
        visit(top, None)
        stack[-1] = (top, iter(os.listdir(top)))
        while stack:
            fd, names = stack[-1]
            name = next(names, None)
            if name is None:
                os.close(fd)
                stack.pop()
                continue
            try:
                folder = stat.S_ISDIR(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode)
                below = os.open(name, _DIR, dir_fd=fd) if folder else None
            except OSError as exc:
                if exc.errno in _GONE_OR_A_LINK:
                    continue
                raise
            if below is None:
                visit(fd, name)
                continue
            stack.append((below, iter(())))  # closed with the stack, should visit raise
            visit(below, None)
            stack[-1] = (below, iter(os.listdir(below)))
    finally:
        for fd, _ in stack:  # a level is closed as it is left; these, on an error
            os.close(fd)


def chown_tree(root: Path, uid: int, gid: int) -> None:
    """Give ``root`` and everything below it to ``uid``:``gid``, links included (the
    link itself), never following one."""

    def give(fd: int, name: str | None) -> None:
        if name is None:
            os.fchown(fd, uid, gid)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.chown(name, uid, gid, dir_fd=fd, follow_symlinks=False)

    walk(root, give)


def chmod_tree(root: Path, mode: Callable[[int, bool], int]) -> None:
    """Set every folder's and regular file's mode below ``root`` to ``mode(old, is_dir)``;
    links and anything else are left alone, and never followed."""

    def change(fd: int, name: str | None) -> None:
        if name is None:
            os.fchmod(fd, mode(os.fstat(fd).st_mode, True))
            return
        try:
            flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
            file = os.open(name, flags, dir_fd=fd)
        except OSError:  # a link (ELOOP), or gone
            return
        try:
            st = os.fstat(file)
            if stat.S_ISREG(st.st_mode):
                os.fchmod(file, mode(st.st_mode, False))
        finally:
            os.close(file)

    walk(root, change)
