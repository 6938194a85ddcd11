"""``trainyard artifacts ls|get``: a job's files (its model, spec, checkpoints, a
script's outputs), and ``trainyard recipes``: what a job can name."""

from __future__ import annotations

import os
import sys
from pathlib import Path, PurePosixPath
from typing import Annotated, BinaryIO
from urllib.parse import quote

import httpx
import typer
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

from service.cli.app import app
from service.cli.blobs import CHUNK_BYTES, PROGRESS_FROM_BYTES, UPLOAD_TIMEOUT
from service.cli.http import TokenOpt, UrlOpt, call, connect, refused, unreachable
from service.cli.printable import printable

artifacts_app = typer.Typer(help="A job's files: model, spec, checkpoints.", no_args_is_help=True)
app.add_typer(artifacts_app, name="artifacts")


@artifacts_app.command("ls")
def list_artifacts(job_id: int, url: UrlOpt = None, token: TokenOpt = None) -> None:
    """A job's files, by the name `artifacts get` takes, with their sizes."""
    with connect(url, token) as client:
        files = call(client, "GET", f"/jobs/{job_id}/artifacts")
    typer.echo(f"{'BYTES':>12}  NAME")
    for file in files:
        typer.echo(printable(f"{file['size']:>12}  {file['name']}"))


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
    path = f"/jobs/{job_id}/artifacts/{quote(name)}"
    with connect(url, token) as client:
        try:
            response = client.send(
                client.build_request("GET", path, timeout=UPLOAD_TIMEOUT), stream=True
            )
        except httpx.HTTPError as exc:
            raise unreachable(client, exc) from exc
        try:
            if response.is_error:
                refused(response)
            if to_stdout:
                _copy(response, sys.stdout.buffer, label=name)
                return
            size = _save(response, dest, label=name)
        except httpx.HTTPError as exc:  # the server went away mid-answer
            typer.echo(printable(f"error: the download of {name} was cut short: {exc}"), err=True)
            raise typer.Exit(2) from exc
        finally:
            response.close()
    typer.echo(printable(f"{dest} ({size} bytes)"))


def _save(response: httpx.Response, dest: Path, *, label: str) -> int:
    """Write the answer beside ``dest``, then move it there: an interrupted download
    never leaves a partial file under the name."""
    part = dest.with_name(f".{dest.name}.{os.getpid()}.part")  # the umask's mode, as dest
    try:
        with open(part, "xb") as out:
            size = _copy(response, out, label=label)
        os.replace(part, dest)
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    return size


def _copy(response: httpx.Response, out: BinaryIO, *, label: str) -> int:
    """The answer's bytes into ``out`` a chunk at a time; a bar on stderr for a big one."""
    total = int(response.headers.get("Content-Length", 0)) or None
    with Progress(
        TextColumn(printable(label), markup=False),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        console=Console(stderr=True),
        disable=(total or 0) < PROGRESS_FROM_BYTES,
    ) as bar:
        task = bar.add_task("download", total=total)
        written = 0
        for chunk in response.iter_bytes(CHUNK_BYTES):
            out.write(chunk)
            written += len(chunk)
            bar.advance(task, len(chunk))
    return written


@app.command()
def recipes(url: UrlOpt = None, token: TokenOpt = None) -> None:
    """The recipes the running workers offer, with what each trains."""
    with connect(url, token) as client:
        offered = call(client, "GET", "/recipes")
    if not offered:
        typer.echo("no recipes: no worker is running (start one: trainyard worker)", err=True)
        return
    width = max(len(r["name"]) for r in offered)
    typer.echo(f"{'NAME':<{width}}  SUMMARY")
    for recipe in offered:
        typer.echo(printable(f"{recipe['name']:<{width}}  {recipe['summary']}"))
