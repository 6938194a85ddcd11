"""Which walls this worker puts around its jobs, decided once at start and said in its
log and on ``/api/v1/workers``: the account jobs run as, and whether a one-box job gets a
network of its own.

- **The account.** A worker running as root runs each job's processes as
  ``TRAINYARD_JOB_USER`` (the image creates ``trainyard-job``), as slurmd runs jobs as
  their users: the job then cannot read the database, the token file, the data directory
  or the worker's memory. The job's own folder is handed to that account at each start;
  the package, the data files and the caches it reads are opened to its group, read-only.
  A worker that is not root runs jobs as its own account, and says what follows.
- **The network.** ``workers.runner.confine`` raises it in the runner; it is probed here,
  in a process of its own, as a runner does it.
"""

from __future__ import annotations

import logging
import os
import pwd
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from service.settings import Settings
from workers.handoff import JobAccount
from workers.supervisor import nofollow
from workers.venv_names import READY  # a virtualenv's last file

log = logging.getLogger(__name__)

VENVS_MODE = 0o1770  # sticky: an entry is removed or renamed by its owner only
# The job account's import of the runner, tried at start.
READY_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Walls:
    """What protects the box from a job here; ``network``: one-box jobs get their own."""

    account: JobAccount | None
    network: bool
    runs_as: str  # said on /api/v1/workers: the account a job's processes run as
    network_why: str | None = None  # why jobs share the box's network, when they do
    # who a job's folder goes back to once its attempt ends: the data directory's owner
    # (the API's account, which serves the artifacts; in the image, not root)
    owner: tuple[int, int] = (0, 0)
    # TRAINYARD_JOB_UIDS: each running attempt runs as a uid of its own from this range
    uids: range | None = None

    @classmethod
    def at_start(cls, settings: Settings) -> Walls:
        """Resolve the job account and probe the network; SystemExit on a setting that
        cannot hold here. Says in the log which protection is in force."""
        root = os.geteuid() == 0
        account = None
        if settings.job_user is not None:
            if not root:
                raise SystemExit(
                    f"TRAINYARD_JOB_USER={settings.job_user} needs a worker that runs as root "
                    "(to start jobs as that account); this one runs as "
                    f"uid {os.geteuid()}, so its jobs would run as it anyway"
                )
            try:
                account = JobAccount.named(settings.job_user)
            except ValueError as exc:
                raise SystemExit(f"TRAINYARD_JOB_USER: {exc}") from None
            _check_reachable(settings, account)
            log.info("jobs run as %s (uid %d), not as this worker", account.name, account.uid)
            runs_as = account.name
        elif root:
            runs_as = "root"
            log.warning(
                "this worker runs as root and TRAINYARD_JOB_USER is unset: jobs run as root, "
                "and can read the database, the API token and every job's files; set "
                "TRAINYARD_JOB_USER to an unprivileged account"
            )
        else:
            runs_as = _own_name()
            log.warning(
                "jobs run as this worker's own account (%s): they can read what it can "
                "(its data directory, a SQLite database, other jobs' folders); run the "
                "worker as root with TRAINYARD_JOB_USER to keep jobs out of them",
                runs_as,
            )
        network, why = False, None
        if settings.job_network == "isolated":
            why = probe(account)
            network = why is None
            if network:
                log.info("one-box jobs run in a network of their own (loopback only)")
            else:
                log.warning(
                    "jobs share the box's network (%s): another local account could reach "
                    "a running job's rendezvous store and gloo/NCCL sockets",
                    why,
                )
        else:
            why = "TRAINYARD_JOB_NETWORK=host"
            log.warning("jobs share the box's network (TRAINYARD_JOB_NETWORK=host)")
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        uids = _uid_range(settings, account)
        if uids is not None:
            runs_as = f"{runs_as} (a uid of its own per attempt, {settings.job_uids})"
            log.info("each attempt runs as a uid of its own, from %s", settings.job_uids)
        home = settings.data_dir.resolve().stat()
        return cls(account, network, runs_as, why, (home.st_uid, home.st_gid), uids)

    def account_for(self, in_use: set[int]) -> JobAccount | None:
        """The account a new attempt runs as: the job account, or (with a uid range) a
        uid of the range no running attempt has, in the job account's group; None while
        none is free (claim nothing then)."""
        if self.account is None or self.uids is None:
            return self.account
        free = next((uid for uid in self.uids if uid not in in_use), None)
        return None if free is None else self.account.model_copy(update={"uid": free})

    def room(self, in_use: set[int]) -> bool:
        """Whether a new attempt could start: a uid of the range is free."""
        return self.uids is None or len(in_use) < len(self.uids)  # uids need an account

    def published(self) -> dict[str, Any]:
        """What ``/api/v1/workers`` shows of it."""
        return {
            "runs_jobs_as": self.runs_as,
            "job_network": "isolated" if self.network else "shared",
            **({"job_network_why": self.network_why} if self.network_why else {}),
        }

    def hand_over(
        self,
        job_folder: Path,
        reads: list[Path],
        shared: Path | None = None,
        account: JobAccount | None = None,
    ) -> None:
        """Give the job's account its own folder (everything in it, from earlier attempts
        too; and ``shared``, a job across boxes' checkpoints) and read access to ``reads``
        (its package, its data files); nothing to do when jobs run as the worker's
        account. Never through a link (``nofollow``): the folder may hold the job's.
        ``account``: the attempt's own (a uid of the range), else the job account."""
        account = account or self.account
        if account is None:
            return
        for own in (job_folder, *([shared] if shared is not None else [])):
            own.mkdir(parents=True, exist_ok=True)
            nofollow.chown_tree(own, account.uid, account.gid)
        if shared is not None:  # SHARED_DIR/jobs/<id>/checkpoints, reached by passing through
            _pass_through(shared.parent)
        for path in reads:
            _readable_by(path.resolve(), account.gid)

    def take_back(self, job_folder: Path, venvs: Path) -> None:
        """Once an attempt's last process is gone: its folder is the worker's again, so
        the next job (which runs as the same account) cannot read or change it; and
        every virtualenv built whole meanwhile is sealed, readable, for every job."""
        if self.account is None:
            return
        if job_folder.is_dir():
            nofollow.chown_tree(job_folder, *self.owner)
        for built in venvs.glob(f"*/{READY}"):
            try:
                if built.parent.lstat().st_uid != os.geteuid():  # a job's, not sealed yet
                    _seal(built.parent, self.account.gid)
            except OSError as exc:  # swapped for a link meanwhile: left as it is
                log.warning("virtualenv %s not sealed: %s", built.parent, exc)


MAX_UIDS = 4096  # a range past this is a typo, not a box's running attempts


def _uid_range(settings: Settings, account: JobAccount | None) -> range | None:
    """TRAINYARD_JOB_UIDS as a range; SystemExit where it cannot hold: without a job
    account, too wide, or holding a uid some account of the box has."""
    if settings.job_uids is None:
        return None
    if account is None:
        raise SystemExit("TRAINYARD_JOB_UIDS needs TRAINYARD_JOB_USER (whose group they share)")
    first, last = (int(x) for x in settings.job_uids.split("-"))
    uids = range(first, last + 1)
    if not 0 < len(uids) <= MAX_UIDS or first < 1000:
        raise SystemExit(
            f"TRAINYARD_JOB_UIDS={settings.job_uids}: give 1 to {MAX_UIDS} uids, from 1000 up"
        )
    for uid in uids:
        try:
            taken = pwd.getpwuid(uid).pw_name
        except KeyError:
            continue
        raise SystemExit(
            f"TRAINYARD_JOB_UIDS={settings.job_uids} holds uid {uid}, the account {taken}'s: "
            "give a range no account uses"
        )
    return uids


def _check_reachable(settings: Settings, account: JobAccount) -> None:
    """The job account must run this worker's Python and reach the worker's folders;
    the worker opens its own folders to pass through (not to list), never the folders
    above them, which are the box's: SystemExit naming the one in the way."""
    data_dir = settings.data_dir.resolve()
    cache_dir = settings.cache_path
    blobs_dir = settings.blobs_path.resolve()
    venvs = cache_dir / "venvs"
    for folder in (data_dir / "jobs", cache_dir / "code", cache_dir / "blobs", venvs):
        folder.mkdir(parents=True, exist_ok=True)
    for folder in (data_dir, data_dir / "jobs", cache_dir, cache_dir / "code", cache_dir / "blobs"):
        _pass_through(folder)
    if blobs_dir.is_dir():
        for folder in (blobs_dir, blobs_dir / "sha256"):
            folder.mkdir(exist_ok=True)
            _pass_through(folder)
    # Requirement sets' virtualenvs are built by the job's pip, as the job's account, in a
    # folder its group may add to; sticky, so that no job removes or renames a virtualenv
    # it did not make, and each is sealed (the worker's, read-only) once an attempt ends.
    os.chown(venvs, os.geteuid(), account.gid)
    venvs.chmod(VENVS_MODE)
    _adopt_venvs(venvs, account.gid)
    shared = [settings.shared_dir.resolve()] if settings.shared_dir is not None else []
    for folder in shared:  # a job across boxes' checkpoints: SHARED_DIR/jobs/<id>/
        (folder / "jobs").mkdir(parents=True, exist_ok=True)
        _pass_through(folder)
        _pass_through(folder / "jobs")
    for top in (data_dir, cache_dir, Path(sys.executable).parent, *shared):
        for part in top.parents:
            if part.stat().st_mode & 0o001 == 0:
                raise SystemExit(
                    f"TRAINYARD_JOB_USER={account.name} cannot reach {top}: {part} is closed "
                    f"to other accounts (mode {part.stat().st_mode & 0o777:o}); keep the "
                    "worker's folders and Python where other accounts can pass through"
                )
    try:
        done = subprocess.run(
            [sys.executable, "-P", "-c", "import torch, workers.runner.main"],
            user=account.uid,
            group=account.gid,
            extra_groups=account.groups,
            cwd="/",
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **_pythonpath()},
            capture_output=True,
            text=True,
            timeout=READY_TIMEOUT_S,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise SystemExit(
            f"TRAINYARD_JOB_USER={account.name} cannot run {sys.executable}: {exc}"
        ) from None
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or ["?"])[-1]
        raise SystemExit(f"TRAINYARD_JOB_USER={account.name} cannot run this worker's code: {why}")


def _adopt_venvs(venvs: Path, gid: int) -> None:
    """Virtualenvs and their locks from before jobs ran as the job account (the worker's,
    owner-only): readable by the account from now on, the locks writable."""
    for entry in venvs.iterdir():
        st = entry.lstat()
        if st.st_uid != os.geteuid() or st.st_gid == gid:
            continue  # the account's own, or sealed already
        if stat.S_ISDIR(st.st_mode):
            _seal(entry, gid)
        elif stat.S_ISREG(st.st_mode) and entry.suffix == ".lock":
            os.chown(entry, -1, gid, follow_symlinks=False)
            entry.chmod(0o660)


def _pythonpath() -> dict[str, str]:
    return {"PYTHONPATH": os.environ["PYTHONPATH"]} if "PYTHONPATH" in os.environ else {}


def _pass_through(folder: Path) -> None:
    """Let other accounts pass through ``folder`` (not list it)."""
    mode = folder.stat().st_mode & 0o777
    if mode & 0o011 != 0o011:
        folder.chmod(mode | 0o011)


def _readable_by(path: Path, gid: int) -> None:
    """Make ``path`` (a file, or a folder and everything in it) readable by group ``gid``,
    never writable: a package or data file may be shared by several jobs."""
    if path.is_file():
        os.chown(path, -1, gid, follow_symlinks=False)
        path.chmod(path.stat().st_mode & 0o750 | 0o040)
        return
    nofollow.chown_tree(path, os.geteuid(), gid)
    nofollow.chmod_tree(path, lambda mode, folder: mode & 0o755 | (0o050 if folder else 0o040))


def _seal(folder: Path, gid: int) -> None:
    """The worker's own from now on, readable and runnable by the job account's group,
    writable by no job. The folder is the worker's before anything in it is touched, so
    no job can swap an entry meanwhile; and no link is ever followed (``nofollow``)."""
    nofollow.chown_tree(folder, os.geteuid(), gid)  # top down: each folder first
    nofollow.chmod_tree(folder, lambda mode, f: 0o750 if f or mode & 0o100 else 0o640)


def probe(account: JobAccount | None = None) -> str | None:
    """Whether a runner here could isolate its network (as ``account``, if given): None
    if so, else why not. Tried in a new process, as a runner does it."""
    # Light: it runs at every worker start. The account's switch is confine.become's,
    # written out here so that the probe imports no model.
    code = (
        "import os, socket, sys\n"
        "from workers.runner.confine import isolate_network\n"
        "if len(sys.argv) > 1:\n"
        "    uid, gid, *groups = (int(x) for x in sys.argv[1:])\n"
        "    os.setgroups(groups); os.setgid(gid); os.setuid(uid)\n"
        "    import ctypes; ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)  # dumpable again\n"
        "isolate_network()\n"
        "socket.create_server(('127.0.0.1', 0)).close()\n"
    )
    ids = [] if account is None else [account.uid, account.gid, *account.groups]
    argv = [sys.executable, "-P", "-c", code, *map(str, ids)]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=READY_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    if done.returncode == 0:
        return None
    lines = done.stderr.strip().splitlines()
    return lines[-1] if lines else f"exit status {done.returncode}"


def _own_name() -> str:
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return f"uid {os.geteuid()}"
