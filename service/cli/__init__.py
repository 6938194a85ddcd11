"""The ``trainyard`` command.

``service.cli.service`` runs the service on this box (migrate, serve, worker, up);
``service.cli.jobs`` talks to a running one over HTTP (submit, ls, status, logs, cancel),
``service.cli.blobs`` uploads and manages blobs (``--code`` packs with ``service.cli.pack``).
"""

from __future__ import annotations

import sys

from pydantic import ValidationError

from service.cli import blobs, jobs, service, users  # noqa: F401  (each registers its commands)
from service.cli.app import app


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
