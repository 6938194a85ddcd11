"""Blobs from the command line: uploading what the server lacks (digest first, then only
the missing bytes), and ``trainyard blobs ls`` / ``trainyard blobs rm``."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import httpx
import typer
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

from service.cli.app import app
from service.cli.http import TokenOpt, UrlOpt, call, connect, unreachable

blobs_app = typer.Typer(help="Uploaded code packages and data files.", no_args_is_help=True)
app.add_typer(blobs_app, name="blobs")

CHUNK_BYTES = 2**20
PROGRESS_FROM_BYTES = 8 * 2**20  # a bar for uploads at least this big
UPLOAD_TIMEOUT = httpx.Timeout(30, read=600, write=600)


def digest_of(path: Path) -> str:
    """sha256:<hex> of a file, read in chunks."""
    hasher = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            hasher.update(chunk)
    return f"sha256:{hasher.hexdigest()}"


def upload(api: httpx.Client, path: Path, *, label: str, console: Console) -> str:
    """The file's digest, after uploading it unless the server has it (``HEAD`` first)."""
    digest = digest_of(path)
    try:
        present = api.head(f"/blobs/{digest}").status_code == 200
    except httpx.HTTPError as exc:
        raise unreachable(api, exc) from exc
    if present:
        console.print(f"{label}: {digest} already uploaded", markup=False, soft_wrap=True)
        return digest
    size = path.stat().st_size
    with Progress(
        TextColumn(f"{label}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        console=console,
        disable=size < PROGRESS_FROM_BYTES,
    ) as bar:
        task = bar.add_task("upload", total=size)

        def chunks() -> Iterator[bytes]:
            with open(path, "rb") as f:
                while chunk := f.read(CHUNK_BYTES):
                    bar.advance(task, len(chunk))
                    yield chunk

        call(
            api,
            "PUT",
            f"/blobs/{digest}",
            content=chunks(),
            headers={"Content-Type": "application/octet-stream", "Content-Length": str(size)},
            timeout=UPLOAD_TIMEOUT,
        )
    console.print(f"{label}: {digest} uploaded ({size} bytes)", markup=False, soft_wrap=True)
    return digest


@blobs_app.command("ls")
def list_blobs(limit: int = 50, url: UrlOpt = None, token: TokenOpt = None) -> None:
    """List stored blobs, newest first, with the jobs that use them."""
    with connect(url, token) as api:
        page = call(api, "GET", "/blobs", params={"limit": limit})
    typer.echo(f"{'DIGEST':<71}  {'BYTES':>12}  {'CREATED':<19}  JOBS")
    for blob in page["items"]:
        jobs = ", ".join(f"{u['job_id']}:{u['role']}" for u in blob["jobs"]) or "-"
        typer.echo(f"{blob['digest']}  {blob['size']:>12}  {blob['created_at'][:19]}  {jobs}")


@blobs_app.command("rm")
def remove_blobs(
    digests: Annotated[list[str], typer.Argument(help="sha256:<hex> of each blob")],
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Delete blobs (refused while an unfinished job uses one)."""
    with connect(url, token) as api:
        for digest in digests:
            call(api, "DELETE", f"/blobs/{digest}")
            typer.echo(f"deleted {digest}")
