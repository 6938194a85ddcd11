"""Blobs from the command line: uploading what the server lacks (the client sends only
what it does not have), a transfer's progress bar, and ``trainyard blobs ls`` /
``trainyard blobs rm``."""

from __future__ import annotations

from pathlib import Path
from types import TracebackType
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TransferSpeedColumn,
)

from service.cli.api import TokenOpt, UrlOpt, connect
from service.cli.app import app
from service.cli.printable import printable
from service.cli.show import moment
from trainyard import Client, Upload

blobs_app = typer.Typer(help="Uploaded code packages and data files.", no_args_is_help=True)
app.add_typer(blobs_app, name="blobs")

PROGRESS_FROM_BYTES = 8 * 2**20  # a bar for transfers at least this big


class Transfer:
    """A transfer's bar on stderr, called with each chunk's bytes (the client's
    ``progress``). Drawn from the first chunk, and only if ``size`` (known by then) is big
    enough: a file the server has already, which sends no chunk, shows none."""

    def __init__(self, label: str, console: Console, size: int | None = None) -> None:
        self.size = size
        self._bar = Progress(
            TextColumn(printable(label), markup=False),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            console=console,
        )
        self._task: TaskID | None = None
        self._drawn = False

    def __call__(self, chunk: int) -> None:
        if self._task is None:
            self._task = self._bar.add_task("transfer", total=self.size)
            self._drawn = (self.size or 0) >= PROGRESS_FROM_BYTES
            if self._drawn:
                self._bar.start()
        self._bar.advance(self._task, chunk)

    def __enter__(self) -> Transfer:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._drawn:
            self._bar.stop()


def uploaded(up: Upload, *, label: str, console: Console) -> str:
    """Say what became of an upload; its digest."""
    said = f"uploaded ({up.size} bytes)" if up.sent else "already uploaded"
    console.print(f"{label}: {up.digest} {said}", markup=False, soft_wrap=True)
    return up.digest


def upload(client: Client, path: Path, *, label: str, console: Console) -> str:
    """The file's digest, after uploading it unless the server has it."""
    with Transfer(label, console, path.stat().st_size) as bar:
        up = client.upload(path, progress=bar)
    return uploaded(up, label=label, console=console)


@blobs_app.command("ls")
def list_blobs(limit: int = 50, url: UrlOpt = None, token: TokenOpt = None) -> None:
    """List stored blobs, newest first, with the jobs that use them."""
    with connect(url, token) as client:
        page = client.blobs_page(limit=limit)
    typer.echo(f"{'DIGEST':<71}  {'BYTES':>12}  {'CREATED':<19}  JOBS")
    for blob in page.items:
        jobs = ", ".join(f"{u.job_id}:{u.role}" for u in blob.jobs) or "-"
        typer.echo(f"{blob.digest}  {blob.size:>12}  {moment(blob.created_at)}  {jobs}")


@blobs_app.command("rm")
def remove_blobs(
    digests: Annotated[list[str], typer.Argument(help="sha256:<hex> of each blob")],
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Delete blobs (refused while an unfinished job uses one)."""
    with connect(url, token) as client:
        for digest in digests:
            client.delete_blob(digest)
            typer.echo(f"deleted {digest}")
