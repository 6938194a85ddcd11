"""Jobs on a running server: ls, status, logs, cancel, rerun, and following one until it
ends (``submit`` is in ``submit.py``; how a job is shown, in ``show.py``)."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from service.cli.api import TokenOpt, UrlOpt, connect, listing
from service.cli.app import app
from service.cli.printable import printable
from service.cli.show import node_line, print_job, print_jobs
from trainyard import Client
from trainyard.models import JobRead, JobStatus

FOLLOW_POLL_S = 0.5
FollowOpt = Annotated[bool, typer.Option("--follow", "-f", help="Watch until it ends.")]


def follow_job(client: Client, job_id: int) -> int:
    """A progress bar (steps, epoch, loss, ETA) until the job ends; 0 only on success."""
    console = Console(stderr=True)
    columns = (
        TextColumn("job {task.fields[job]} {task.fields[status]}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("epoch {task.fields[epoch]} loss {task.fields[loss]} eta {task.fields[eta]}"),
    )
    shown_nodes = ""
    with Progress(*columns, console=console, transient=False) as bar:
        task = bar.add_task(
            "", total=None, job=job_id, status="queued", epoch="-", loss="-", eta="-"
        )
        while True:
            job = client.job(job_id)
            nodes = node_line(job)
            if nodes and nodes != shown_nodes:  # a gang forming, or the nodes it runs on
                console.print(nodes, markup=False)
                shown_nodes = nodes
            p = job.progress
            bar.update(
                task,
                total=(p.total_steps if p else 0) or None,
                completed=p.step if p else 0,
                status=printable(job.status),
                epoch=f"{p.epoch}/{p.epochs}" if p else "-",
                loss=f"{p.loss:.4g}" if p and p.loss is not None else "-",
                eta=f"{p.eta_s:.0f}s" if p and p.eta_s is not None else "-",
            )
            if job.status.finished:
                break
            time.sleep(FOLLOW_POLL_S)
    reason = job.reason.message if job.reason else ""
    # markup off: "[...]" in a reason is the job's text, not rich's styling
    console.print(printable(f"job {job_id} {job.status}: {reason}"), markup=False, soft_wrap=True)
    return 0 if job.status == JobStatus.succeeded else 1


@app.command()
def status(
    job_id: Annotated[int | None, typer.Argument()] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="The job as the API gives it (for jq, scripts).")
    ] = False,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Show one job in full, or the newest jobs."""
    with connect(url, token) as client:
        if job_id is None:
            _print_list(client.jobs_page(limit=20).items, as_json)
            return
        job = client.job(job_id)
    if as_json:
        # ensure_ascii: JSON escapes every control character (and all non-ASCII)
        typer.echo(json.dumps(job.model_dump(mode="json"), indent=2, ensure_ascii=True))
    else:
        print_job(job)


@app.command("ls")
def list_jobs(
    status_: Annotated[str | None, typer.Option("--status")] = None,
    mine: Annotated[bool, typer.Option("--mine", help="Only your own jobs.")] = False,
    owner: Annotated[str | None, typer.Option(help="Only this user's jobs.")] = None,
    sweep: Annotated[int | None, typer.Option(help="Only this sweep's trials.")] = None,
    limit: int = 20,
    as_json: Annotated[bool, typer.Option("--json", help="The API's page, as JSON.")] = False,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """List jobs, newest first: everyone's, one user's, or one sweep's trials."""
    with connect(url, token) as client:
        page = client.jobs_page(**listing(status_, mine, owner), sweep=sweep, limit=limit)
    _print_list(page.items, as_json)


def _print_list(jobs: Sequence[JobRead], as_json: bool) -> None:
    if as_json:
        shown = [job.model_dump(mode="json") for job in jobs]
        typer.echo(json.dumps(shown, indent=2, ensure_ascii=True))
    else:
        print_jobs(jobs)


@app.command()
def logs(
    job_id: int,
    follow: FollowOpt = False,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Print a job's log lines (with -f, until the job ends)."""
    with connect(url, token) as client:
        for line in client.logs(job_id, follow=follow):
            typer.echo(printable(line.text))


@app.command()
def cancel(job_id: int, url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Cancel a job."""
    with connect(url, token) as client:
        job = client.cancel(job_id)
        typer.echo(printable(f"job {job_id}: {job.status}"))


@app.command()
def rerun(
    job_id: int, follow: FollowOpt = False, url: UrlOpt = None, token: TokenOpt = None
) -> None:
    """Submit a job again as it was (code, data, seed, every field); prints the new id."""
    with connect(url, token) as client:
        job = client.rerun(job_id)
        typer.echo(job.id)
        if follow:
            raise typer.Exit(follow_job(client, job.id))
