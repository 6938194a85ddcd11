"""The ``trainyard`` command.

``service.cli.service`` runs the service on this box (migrate, serve, worker, up);
``service.cli.submit`` and ``service.cli.jobs`` talk to a running one over HTTP (submit;
ls, status, logs, cancel, rerun), ``service.cli.artifacts`` fetches a job's files and
lists recipes, ``service.cli.blobs`` uploads and manages blobs (``--code`` packs with
``service.cli.pack``, ``service.cli.inputs`` turns directories and files into digests).
"""

from __future__ import annotations

import sys

from pydantic import ValidationError
from typer.models import CommandInfo

from service.cli import (  # noqa: F401  (each registers its commands)
    artifacts,
    blobs,
    compare,
    export,
    jobs,
    service,
    submit,
    sweeps,
    users,
)
from service.cli.app import app

# Typer lists commands in the order they registered, the modules' import order: the
# ones a user reaches for first go first.
FIRST = ("submit", "ls", "status", "logs", "cancel", "rerun", "recipes")


def _rank(command: CommandInfo) -> int:
    name = command.name or getattr(command.callback, "__name__", "")
    return FIRST.index(name) if name in FIRST else len(FIRST)


app.registered_commands.sort(key=_rank)


def main() -> None:
    """Console-script entry point."""
    try:
        app()
    except ValidationError as bad:  # a TRAINYARD_* setting: say which, without a traceback
        for error in bad.errors():
            field = "_".join(str(part) for part in error["loc"]).upper()
            message = error["msg"].removeprefix("Value error, ")
            sys.stderr.write(f"error: TRAINYARD_{field}: {message}\n")
        sys.exit(2)
