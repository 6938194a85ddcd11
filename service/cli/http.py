"""Talking to a Trainyard server: its address and token options, and one way to call it
that turns every failure into a message and an exit code."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer

from service.cli.printable import printable

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
# A server bound to every address is reached on loopback.
_ANY_ADDRESS = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}
WHERE = (
    "point the CLI at the server with --url or TRAINYARD_URL (without either it follows "
    "TRAINYARD_HOST and TRAINYARD_PORT, as the server does)"
)


def server_url(url: str | None) -> str:
    """The server's address: ``url`` if given, else the one the server on this box listens
    on, from the same TRAINYARD_HOST and TRAINYARD_PORT that ``trainyard serve`` reads."""
    if url:
        return url
    host = os.environ.get("TRAINYARD_HOST", "127.0.0.1").strip()
    host = _ANY_ADDRESS.get(host, host)
    port = os.environ.get("TRAINYARD_PORT", "8000").strip()
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        typer.echo(f"error: TRAINYARD_PORT: not a port number: {port!r}", err=True)
        raise typer.Exit(2)
    return f"http://{f'[{host}]' if ':' in host else host}:{port}"


def connect(url: str | None, token: str | None) -> httpx.Client:
    """A client of the server's API; without a token, the one in TRAINYARD_API_TOKEN_FILE
    if that is set (a file, so that no shell's environment need hold it)."""
    token = token or token_from_file()
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    base = server_url(url).rstrip("/") + "/api/v1"
    return httpx.Client(base_url=base, headers=headers, timeout=30)


def token_from_file() -> str | None:
    path = os.environ.get("TRAINYARD_API_TOKEN_FILE")
    if not path:
        return None
    try:
        return Path(path).read_text().strip().splitlines()[0]
    except (OSError, IndexError) as exc:
        typer.echo(f"error: TRAINYARD_API_TOKEN_FILE: cannot read a token from {path}", err=True)
        raise typer.Exit(2) from exc


def shown(url: httpx.URL) -> str:
    """A server's address as it may be printed: a password in it as ``***``."""
    return str(url.copy_with(username=url.username, password="***") if url.password else url)


def unreachable(client: httpx.Client, exc: httpx.HTTPError) -> typer.Exit:
    """Say that the server did not answer, and how to name another; the exit to raise."""
    typer.echo(f"error: cannot reach {shown(client.base_url)}: {exc}; {WHERE}", err=True)
    return typer.Exit(2)


def listing(limit: int, status: str | None, mine: bool, owner: str | None) -> dict[str, Any]:
    """A listing's query (jobs, sweeps): a page, of one status, one owner's or your own."""
    params: dict[str, Any] = {"limit": limit}
    if status:
        params["status"] = status
    if mine or owner:
        params["owner"] = "me" if mine else owner
    return params


def call(client: httpx.Client, method: str, path: str, **kwargs: Any) -> Any:
    """The JSON of the server's answer; an error printed and the exit raised otherwise."""
    try:
        response = client.request(method, path, **kwargs)
    except httpx.HTTPError as exc:
        raise unreachable(client, exc) from exc
    if response.is_error:
        refused(response)
    return response.json() if response.content else None


def refused(response: httpx.Response) -> None:
    """Print the server's error (its detail, field by field) and exit 1."""
    response.read()  # a streamed answer's body, too
    try:
        body = response.json()
    except ValueError:
        body = response.text
    detail = body.get("detail", body) if isinstance(body, dict) else body
    if isinstance(detail, list):
        detail = "; ".join(
            f"{'.'.join(map(str, d.get('loc', [])[1:]))}: {d.get('msg')}" for d in detail
        )
    # the detail may quote the job's own text (a name, a recipe): escaped
    typer.echo(printable(f"error {response.status_code}: {detail}"), err=True)
    raise typer.Exit(1)
