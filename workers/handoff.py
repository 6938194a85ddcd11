"""What the supervisor hands a runner on its stdin: the job, the few settings a runner
needs, and where the job's inputs were placed. No credential: not the database URL, not
the API token, not the lease token. The supervisor is the one process on a box that
holds those; a runner, and every process of the job's code under it, reports through
files the supervisor reads (``workers.points_file``, ``JobFiles``).

The supervisor writes the hand-off from a thread once it has fetched and placed the
job's blobs (``workers.supervisor.inputs``), and the runner waits for it, reading its stdin to the
end before anything else: so the runner starts at once, its lease renewed meanwhile,
while a large package is still on its way.
"""

from __future__ import annotations

import os
import pwd
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from service.models import Job
from service.settings import Settings


class JobAccount(BaseModel):
    """The account a job's processes run as, where the worker runs as root
    (``TRAINYARD_JOB_USER``): it can read the job's package and inputs and write its own
    folder, and nothing of the worker's."""

    name: str
    uid: int
    gid: int
    home: str = "/nonexistent"
    # its supplementary groups as the box lists them (video or render, where a box's GPU
    # device files are its group's): never root's
    groups: list[int] = []

    @classmethod
    def named(cls, name: str) -> JobAccount:
        """The account of that name on this box; ValueError if there is none, or it is
        root."""
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            raise ValueError(f"no account named {name!r} on this box") from None
        if entry.pw_uid == 0 or entry.pw_gid == 0:
            raise ValueError(f"the job account {name!r} is root's (uid or gid 0)")
        groups = [g for g in os.getgrouplist(name, entry.pw_gid) if g != 0]
        return cls(name=name, uid=entry.pw_uid, gid=entry.pw_gid, home=entry.pw_dir, groups=groups)


class JobSettings(BaseModel):
    """The worker's settings a runner uses: paths and times, nothing secret."""

    data_dir: Path
    recipes_dir: Path | None
    shared_dir: Path | None
    # checkpoints go to the object store (its worker uploads them, and downloads the
    # newest before an attempt): a job across boxes keeps them in its own folder too
    checkpoints_in_store: bool = False
    cache_dir: Path
    requirements_timeout_s: float
    advertise_address: str
    socket_ifname: str | None
    gang_timeout_s: float
    # where jobs run as accounts of their own: the worker's uid, which seals a shared
    # virtualenv once the attempt that built it ends (one it has not sealed is not used)
    venvs_sealed_by: int | None = None

    @classmethod
    def of(cls, settings: Settings) -> JobSettings:
        """The settings' paths absolute: the runner's working directory may differ."""
        data_dir = settings.data_dir.resolve()
        return cls(
            data_dir=data_dir,
            recipes_dir=None if settings.recipes_dir is None else settings.recipes_dir.resolve(),
            shared_dir=None if settings.storage_url else settings.shared_dir,
            checkpoints_in_store=settings.storage_url is not None,
            cache_dir=settings.cache_path,
            requirements_timeout_s=settings.requirements_timeout_s,
            advertise_address=settings.advertise_address,
            socket_ifname=settings.socket_ifname,
            gang_timeout_s=settings.gang_timeout_s,
            venvs_sealed_by=os.geteuid() if settings.job_user else None,
        )


class Handoff(BaseModel):
    """One attempt's job and settings, as the supervisor passes them to its runner."""

    job: dict[str, Any]  # the job's row, as JSON
    settings: JobSettings
    package: Path | None = None  # the job's code package, unpacked, read-only
    inputs_error: dict[str, Any] | None = None  # why the inputs could not be placed
    account: JobAccount | None = None  # run as this account (the worker is root)
    isolate_network: bool = False  # a network of its own: loopback only
    gpu_fraction: float | None = None  # a GPU share: the part of its GPU it may allocate

    @classmethod
    def of(cls, job: Job, settings: Settings, **walls: Any) -> Handoff:
        """The job's row without its lease token (a runner writes nothing fenced)."""
        row = job.model_dump(mode="json", exclude={"lease_token"})
        return cls(job=row, settings=JobSettings.of(settings), **walls)

    def the_job(self) -> Job:
        return Job.model_validate(self.job)

    def write(self, fd: int, data: bytes | None = None) -> None:
        """Write the hand-off (``data``: already serialised) whole to a pipe's write end,
        and close it. A runner killed meanwhile (a cancel) has closed its end: nothing to
        hand off then."""
        try:
            payload = self.model_dump_json().encode() if data is None else data
            with open(fd, "wb", closefd=False) as pipe:
                pipe.write(payload)
        except BrokenPipeError:
            pass
        finally:
            os.close(fd)


def read_stdin() -> Handoff:
    """The hand-off on this process's stdin, read to its end; stdin is /dev/null after,
    so the job's processes inherit nothing of it."""
    with open(0, "rb", closefd=False) as stdin:
        data = stdin.read()
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    return Handoff.model_validate_json(data)


def read_file(path: Path) -> Handoff:
    """The hand-off a Slurm worker left in the job's folder (a batch job has no pipe from
    its worker: it may start hours later, on another host); it holds no credential."""
    return Handoff.model_validate_json(path.read_bytes())
