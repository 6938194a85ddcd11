"""The ``trainyard`` command.

``service.cli.service`` runs the service on this box (migrate, serve, worker, up); the
other modules talk to a running one through the Python client, ``trainyard.Client``
(``service.cli.api`` makes it from ``--url`` and ``--token``, and says what goes wrong
with it): ``submit`` and ``jobs`` (submit; ls, status, logs, cancel, rerun),
``artifacts`` (a job's files, and recipes), ``blobs`` (uploads, ls, rm; ``inputs`` turns
a job's directories and files into digests), ``sweeps``, ``compare``, ``export``,
``users`` (users, tokens, audit) and ``webhooks``.
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
    webhooks,
)
from service.cli.api import report
from service.cli.app import app
from service.settings import Settings
from trainyard import ApiError, Unreachable
from trainyard.config import ConfigError

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
        if bad.title != Settings.__name__:  # an answer the client could not read: a bug
            raise
        for error in bad.errors():
            field = "_".join(str(part) for part in error["loc"]).upper()
            message = error["msg"].removeprefix("Value error, ")
            sys.stderr.write(f"error: TRAINYARD_{field}: {message}\n")
        sys.exit(2)
    except (ApiError, Unreachable, ConfigError) as error:  # from any command's client
        sys.exit(report(error))
