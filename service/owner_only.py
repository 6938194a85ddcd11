"""Owner-only files: the database, logs, checkpoints and artifacts are for the user the
service runs as, not for every local user. And owner-only processes: the API's and the
worker's environment (the database URL, the API token) are not for the jobs, whose code
runs as that same user.

Set once, at the start of each command that writes them (``migrate``, ``serve``,
``worker``): the umask is inherited by every process started after it (the zygote,
runners, ranks, scripts, pip), so no file needs its mode set where it is written, and
none can be forgotten. A data dir made before this existed (0755, its files 0644) is
closed by its own mode: no one else can reach what is under it.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
from pathlib import Path

from service.settings import Settings

log = logging.getLogger(__name__)

PRIVATE_UMASK = 0o077  # new files 0600, new folders 0700
PRIVATE_DIR_MODE = 0o700
PASS_THROUGH_DIR_MODE = 0o711
PRIVATE_FILE_MODE = 0o600
SQLITE_SIDE_FILES = ("", "-wal", "-shm", "-journal")  # the database and SQLite's own beside it
PR_SET_DUMPABLE = 4  # prctl(2), from <linux/prctl.h>


def keep_private(settings: Settings) -> None:
    """Make what this process and its children create from now on its user's alone, and
    close the data dir and an existing SQLite database to other users."""
    os.umask(PRIVATE_UMASK)
    data_dir = Path(settings.data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    # Jobs running as another account pass through it to their own folder (not list it).
    _chmod_own(data_dir, PASS_THROUGH_DIR_MODE if settings.job_user else PRIVATE_DIR_MODE)
    from sqlalchemy.engine import make_url  # here: the CLI's other commands do without it

    url = make_url(settings.database_url)
    if url.get_backend_name() == "sqlite" and url.database and url.database != ":memory:":
        for suffix in SQLITE_SIDE_FILES:
            path = Path(url.database + suffix)
            if path.exists():
                _chmod_own(path, PRIVATE_FILE_MODE)


def _chmod_own(path: Path, mode: int) -> None:
    """chmod a path this user owns; one owned by another (a volume mounted as root) is
    left as it is, with a warning: its owner decides."""
    if path.stat().st_uid != os.getuid():
        log.warning("%s belongs to another user; leaving its mode as it is", path)
        return
    path.chmod(mode)


def hide_process() -> None:
    """Make this process's environment and memory unreadable by its user's other processes.

    A job's code runs as the worker's user, and a process may read the environment
    (``/proc/<pid>/environ``) and memory of any other of its user's: the worker's and the
    API's hold the database URL and the API token. A process that is not "dumpable" is
    the exception (as ssh-agent does it): only root may read or trace it. Not inherited
    across exec, so the zygote, runners and scripts stay as they were (and hold no
    secret in their environment: ``workers.env_allowlist``)."""
    if sys.platform != "linux":
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        log.warning("cannot hide this process from its user's jobs: errno %d", ctypes.get_errno())
