"""``trainyard artifacts ls|get``: a job's files (its model, spec, checkpoints, a
script's outputs), and ``trainyard recipes``: what a job can name."""

from __future__ import annotations

import sys
from pathlib import Path, PurePosixPath
from typing import Annotated

import typer
from rich.console import Console

from service.cli.api import TokenOpt, UrlOpt, connect
from service.cli.app import app
from service.cli.blobs import Transfer
from service.cli.printable import printable
from trainyard import Unreachable

artifacts_app = typer.Typer(help="A job's files: model, spec, checkpoints.", no_args_is_help=True)
app.add_typer(artifacts_app, name="artifacts")


@artifacts_app.command("ls")
def list_artifacts(job_id: int, url: UrlOpt = None, token: TokenOpt = None) -> None:
    """A job's files, by the name `artifacts get` takes, with their sizes."""
    with connect(url, token) as client:
        files = client.artifacts(job_id)
    typer.echo(f"{'BYTES':>12}  NAME")
    for file in files:
        typer.echo(printable(f"{file.size:>12}  {file.name}"))


@artifacts_app.command("get")
def get_artifact(
    job_id: int,
    name: Annotated[str, typer.Argument(help="As `trainyard artifacts ls` lists it.")],
    output: Annotated[
        str | None,
        typer.Option(
            "--output",
            "-o",
            help="File or folder to write to (a name ending in / is a folder, made if "
            "missing); - for stdout. Default: the file's own name, here.",
            show_default=False,
        ),
    ] = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Download one of a job's files, streamed to disk."""
    if PurePosixPath(name).name in ("", ".", ".."):
        raise typer.BadParameter(f"{name!r} names no file", param_hint="NAME")
    to_stdout = output == "-"
    dest = Path(output or ".")
    if output is not None and output.endswith("/"):
        dest.mkdir(parents=True, exist_ok=True)
    if dest.is_dir():
        dest = dest / PurePosixPath(name).name
    if not to_stdout and not dest.parent.is_dir():
        raise typer.BadParameter(f"no such folder {dest.parent}", param_hint="--output")
    with connect(url, token) as client:
        # its size, for the bar (a name not listed: the download says why)
        size = next((f.size for f in client.artifacts(job_id) if f.name == name), None)
        try:
            with Transfer(name, Console(stderr=True), size) as bar:
                if to_stdout:
                    client.download_to(job_id, name, sys.stdout.buffer, progress=bar)
                    return
                saved = client.download(job_id, name, dest, progress=bar)
        except Unreachable as exc:  # the server went away mid-answer
            typer.echo(printable(f"error: the download of {name} was cut short: {exc}"), err=True)
            raise typer.Exit(2) from exc
    typer.echo(printable(f"{dest} ({saved.stat().st_size} bytes)"))


@app.command()
def recipes(url: UrlOpt = None, token: TokenOpt = None) -> None:
    """The recipes the running workers offer, with what each trains."""
    with connect(url, token) as client:
        offered = client.recipes()
    if not offered:
        typer.echo("no recipes: no worker is running (start one: trainyard worker)", err=True)
        return
    width = max(len(r.name) for r in offered)
    typer.echo(f"{'NAME':<{width}}  SUMMARY")
    for recipe in offered:
        typer.echo(printable(f"{recipe.name:<{width}}  {recipe.summary}"))
