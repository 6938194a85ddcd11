"""Talking to a Trainyard server: its address and token options, and one way to call it
that turns every failure into a message and an exit code."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer

from service.cli.printable import printable

UrlOpt = Annotated[str, typer.Option("--url", envvar="TRAINYARD_URL", help="Server to talk to.")]
TokenOpt = Annotated[
    str | None, typer.Option("--token", envvar="TRAINYARD_API_TOKEN", help="Bearer token.")
]
DEFAULT_URL = "http://127.0.0.1:8000"


def connect(url: str, token: str | None) -> httpx.Client:
    """A client of the server's API; without a token, the one in TRAINYARD_API_TOKEN_FILE
    if that is set (a file, so that no shell's environment need hold it)."""
    token = token or token_from_file()
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=url.rstrip("/") + "/api/v1", headers=headers, timeout=30)


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


def call(client: httpx.Client, method: str, path: str, **kwargs: Any) -> Any:
    try:
        response = client.request(method, path, **kwargs)
    except httpx.HTTPError as exc:
        typer.echo(f"error: cannot reach {shown(client.base_url)}: {exc}", err=True)
        raise typer.Exit(2) from exc
    if response.is_error:
        try:
            detail = response.json().get("detail")
        except ValueError:
            detail = response.text
        if isinstance(detail, list):
            detail = "; ".join(
                f"{'.'.join(map(str, d.get('loc', [])[1:]))}: {d.get('msg')}" for d in detail
            )
        # the detail may quote the job's own text (a name, a recipe): escaped
        typer.echo(printable(f"error {response.status_code}: {detail}"), err=True)
        raise typer.Exit(1)
    return response.json() if response.content else None
