"""Owner-only files: the database, logs, checkpoints and artifacts are for the user the
service runs as, not for every local user (issue 16, item 8).

Set once, at the start of each command that writes them (``migrate``, ``serve``,
``worker``): the umask is inherited by every process started after it (the zygote,
runners, ranks, scripts, pip), so no file needs its mode set where it is written, and
none can be forgotten. A data dir made before this existed (0755, its files 0644) is
closed by its own mode: no one else can reach what is under it.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from sqlalchemy.engine import make_url

from service.settings import Settings

log = logging.getLogger(__name__)

PRIVATE_UMASK = 0o077  # new files 0600, new folders 0700
PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600
SQLITE_SIDE_FILES = ("", "-wal", "-shm", "-journal")  # the database and SQLite's own beside it


def keep_private(settings: Settings) -> None:
    """Make what this process and its children create from now on its user's alone, and
    close the data dir and an existing SQLite database to other users."""
    os.umask(PRIVATE_UMASK)
    data_dir = Path(settings.data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    _chmod_own(data_dir, PRIVATE_DIR_MODE)
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
