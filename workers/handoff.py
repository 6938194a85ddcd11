"""What the supervisor hands a runner on its stdin: the attempt's lease token and the
worker's settings (the database URL and the API token among them).

Not on the command line: every local user can read any process's argv (``ps``). Not in
the environment: the job's code reads that (``os.environ``, ``/proc/self/environ``),
and so do its children. A pipe holds the hand-off until the runner reads it, before any
job code runs; the runner then points its stdin at /dev/null, so its ranks and scripts
inherit nothing of it. (The runner keeps the settings in memory, where the recipe code it
runs in the same process can still find them: see docs/architecture.md, "Inside the box".)
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from service.settings import Settings

# A pipe holds 64 KiB before a writer blocks; the hand-off is written before the runner
# reads it, so it must fit (it is ~2 KiB).
MAX_HANDOFF_BYTES = 60_000


class Handoff(BaseModel):
    """The runner's secrets and settings, as the supervisor passes them."""

    lease_token: str
    settings: dict[str, Any]

    @classmethod
    def of(cls, lease_token: str, settings: Settings) -> Handoff:
        """The worker's settings, with paths absolute (the runner's cwd may differ)."""
        absolute: dict[str, Path] = {"data_dir": settings.data_dir.resolve()}
        if settings.recipes_dir is not None:
            absolute["recipes_dir"] = settings.recipes_dir.resolve()
        resolved = settings.model_copy(update=absolute)
        return cls(lease_token=lease_token, settings=resolved.model_dump(mode="json"))

    def runner_settings(self) -> Settings:
        """The worker's settings, exactly (not re-read from this process's environment)."""
        return Settings.model_validate(self.settings)

    def pipe(self) -> int:
        """The read end of a pipe that holds this hand-off whole; the caller closes it."""
        data = self.model_dump_json().encode()
        if len(data) > MAX_HANDOFF_BYTES:
            raise ValueError(f"runner hand-off of {len(data)} bytes does not fit a pipe")
        read, write = os.pipe()
        try:
            os.write(write, data)
        except BaseException:
            os.close(read)
            raise
        finally:
            os.close(write)
        return read


def read_stdin() -> Handoff:
    """The hand-off on this process's stdin, read to its end; stdin is /dev/null after."""
    with open(0, "rb", closefd=False) as stdin:
        data = stdin.read()
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    return Handoff.model_validate_json(data)
