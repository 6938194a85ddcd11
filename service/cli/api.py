"""The CLI's side of the API: the ``--url`` and ``--token`` options, the client they make
(``trainyard.Client``: every command talks to the server through it), and what the user
is told of whatever it raises (``report``, which ``main`` calls for every command)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from service.cli.printable import printable
from trainyard import ApiError, Client, Unreachable
from trainyard.config import ConfigError
from trainyard.errors import describe

UrlOpt = Annotated[
    str | None,
    typer.Option(
        "--url",
        envvar="TRAINYARD_URL",
        help="Server to talk to. Default: where `trainyard up` on this box listens, "
        "http://$TRAINYARD_HOST:$TRAINYARD_PORT (127.0.0.1:8000).",
        show_default=False,
    ),
]
TokenOpt = Annotated[
    str | None, typer.Option("--token", envvar="TRAINYARD_API_TOKEN", help="Bearer token.")
]
WHERE = (
    "point the CLI at the server with --url or TRAINYARD_URL (without either it follows "
    "TRAINYARD_HOST and TRAINYARD_PORT, as the server does)"
)


def connect(url: str | None, token: str | None) -> Client:
    """A client of the server's API: at ``url``, else TRAINYARD_HOST and TRAINYARD_PORT's;
    with ``token``, else the one in TRAINYARD_API_TOKEN_FILE if that is set (a file, so
    that no shell's environment need hold it)."""
    return Client(url, token)


def listing(status: str | None, mine: bool, owner: str | None) -> dict[str, Any]:
    """A listing's filters (jobs, sweeps): of one status, one owner's or your own."""
    return {"status": status or None, "owner": "me" if mine else owner}


def report(error: ApiError | Unreachable | ConfigError) -> int:
    """Say what the client raised, as every command does; the exit code: 1 for the
    server's refusal, 2 for a server that did not answer or a TRAINYARD_* variable that
    cannot be used."""
    if isinstance(error, ApiError):
        # the detail may quote the job's own text (a name, a recipe): escaped
        typer.echo(printable(f"error {error.status_code}: {describe(error.detail)}"), err=True)
        return 1
    if isinstance(error, Unreachable):  # it says "cannot reach <the server's address>: why"
        typer.echo(f"error: {error}; {WHERE}", err=True)
        return 2
    typer.echo(f"error: {error}", err=True)
    return 2
