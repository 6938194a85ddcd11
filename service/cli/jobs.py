"""Talking to a Trainyard server over HTTP: submit, ls, status, logs, cancel."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
import yaml
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from service.cli.app import app

UrlOpt = Annotated[str, typer.Option("--url", envvar="TRAINYARD_URL", help="Server to talk to.")]
TokenOpt = Annotated[
    str | None, typer.Option("--token", envvar="TRAINYARD_API_TOKEN", help="Bearer token.")
]
DEFAULT_URL = "http://127.0.0.1:8000"
TERMINAL = {"succeeded", "failed", "cancelled"}
FOLLOW_POLL_S = 0.5


def _client(url: str, token: str | None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=url.rstrip("/") + "/api/v1", headers=headers, timeout=30)


def _call(client: httpx.Client, method: str, path: str, **kwargs: Any) -> Any:
    try:
        response = client.request(method, path, **kwargs)
    except httpx.HTTPError as exc:
        typer.echo(f"error: cannot reach {client.base_url}: {exc}", err=True)
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
        typer.echo(f"error {response.status_code}: {detail}", err=True)
        raise typer.Exit(1)
    return response.json()


def _parse_param(item: str) -> tuple[str, Any]:
    key, sep, raw = item.partition("=")
    if not sep:
        raise typer.BadParameter(f"expected key=value, got {item!r}")
    try:
        return key, json.loads(raw)
    except ValueError:
        return key, raw


@app.command()
def submit(
    file: Annotated[Path | None, typer.Argument(help="Job spec, YAML or JSON.")] = None,
    recipe: Annotated[str | None, typer.Option(help="Recipe (instead of a file).")] = None,
    param: Annotated[list[str] | None, typer.Option("--param", "-p", help="key=value")] = None,
    strategy: Annotated[str | None, typer.Option()] = None,
    devices: Annotated[int | None, typer.Option()] = None,
    accelerator: Annotated[str | None, typer.Option()] = None,
    epochs: Annotated[int | None, typer.Option()] = None,
    batch_size: Annotated[int | None, typer.Option()] = None,
    name: Annotated[str | None, typer.Option()] = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Watch until it ends.")] = False,
    url: UrlOpt = DEFAULT_URL,
    token: TokenOpt = None,
) -> None:
    """Submit a job; prints its id (with --follow, exits 0 only if it succeeds)."""
    spec: dict[str, Any] = {}
    if file is not None:
        try:
            loaded = yaml.safe_load(file.read_text())  # YAML is a superset of JSON
        except (OSError, yaml.YAMLError) as exc:
            raise typer.BadParameter(f"cannot read {file}: {exc}") from exc
        if not isinstance(loaded, dict):
            raise typer.BadParameter(f"{file} must hold a mapping of job fields")
        spec.update(loaded)
    options = {
        "recipe": recipe,
        "strategy": strategy,
        "devices": devices,
        "accelerator": accelerator,
        "epochs": epochs,
        "batch_size": batch_size,
        "name": name,
    }
    spec.update({k: v for k, v in options.items() if v is not None})
    if param:
        spec["params"] = {**spec.get("params", {}), **dict(_parse_param(p) for p in param)}
    if "recipe" not in spec:
        raise typer.BadParameter("give a spec file or --recipe")
    with _client(url, token) as client:
        job = _call(client, "POST", "/jobs", json=spec)
        typer.echo(job["id"])
        if follow:
            raise typer.Exit(_follow(client, job["id"]))


def _follow(client: httpx.Client, job_id: int) -> int:
    """A progress bar (steps, epoch, loss, ETA) until the job ends; 0 only on success."""
    console = Console(stderr=True)
    columns = (
        TextColumn("job {task.fields[job]} {task.fields[status]}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("epoch {task.fields[epoch]} loss {task.fields[loss]} eta {task.fields[eta]}"),
    )
    with Progress(*columns, console=console, transient=False) as bar:
        task = bar.add_task(
            "", total=None, job=job_id, status="queued", epoch="-", loss="-", eta="-"
        )
        while True:
            job = _call(client, "GET", f"/jobs/{job_id}")
            p = job.get("progress") or {}
            bar.update(
                task,
                total=p.get("total_steps") or None,
                completed=p.get("step", 0),
                status=job["status"],
                epoch=f"{p['epoch']}/{p['epochs']}" if p else "-",
                loss=f"{p['loss']:.4g}" if p.get("loss") is not None else "-",
                eta=f"{p['eta_s']:.0f}s" if p.get("eta_s") is not None else "-",
            )
            if job["status"] in TERMINAL:
                break
            time.sleep(FOLLOW_POLL_S)
    reason = (job.get("reason") or {}).get("message", "")
    console.print(f"job {job_id} {job['status']}: {reason}")
    return 0 if job["status"] == "succeeded" else 1


@app.command()
def status(
    job_id: Annotated[int | None, typer.Argument()] = None,
    url: UrlOpt = DEFAULT_URL,
    token: TokenOpt = None,
) -> None:
    """Show one job in full, or the newest jobs."""
    with _client(url, token) as client:
        if job_id is not None:
            typer.echo(json.dumps(_call(client, "GET", f"/jobs/{job_id}"), indent=2))
            return
        _print_jobs(_call(client, "GET", "/jobs", params={"limit": 20})["items"])


@app.command("ls")
def list_jobs(
    status_: Annotated[str | None, typer.Option("--status")] = None,
    limit: int = 20,
    url: UrlOpt = DEFAULT_URL,
    token: TokenOpt = None,
) -> None:
    """List jobs, newest first."""
    params: dict[str, Any] = {"limit": limit}
    if status_:
        params["status"] = status_
    with _client(url, token) as client:
        _print_jobs(_call(client, "GET", "/jobs", params=params)["items"])


def _print_jobs(jobs: list[dict[str, Any]]) -> None:
    for job in jobs:
        reason = (job.get("reason") or {}).get("message", "")
        typer.echo(
            f"{job['id']:>6}  {job['status']:<10}  {job['recipe']:<20}  "
            f"{job['strategy']:<6} x{job['devices']}  {reason}"
        )


@app.command()
def logs(
    job_id: int,
    follow: Annotated[bool, typer.Option("--follow", "-f")] = False,
    url: UrlOpt = DEFAULT_URL,
    token: TokenOpt = None,
) -> None:
    """Print a job's log lines (with -f, until the job ends)."""
    after = 0
    with _client(url, token) as client:
        while True:
            lines = _call(client, "GET", f"/jobs/{job_id}/logs", params={"after_seq": after})
            for line in lines:
                typer.echo(line["text"])
                after = line["seq"]
            if not follow:
                return
            if not lines and _call(client, "GET", f"/jobs/{job_id}")["status"] in TERMINAL:
                # one more read: lines may have landed between the two calls
                for line in _call(
                    client, "GET", f"/jobs/{job_id}/logs", params={"after_seq": after}
                ):
                    typer.echo(line["text"])
                return
            if not lines:
                time.sleep(FOLLOW_POLL_S)


@app.command()
def cancel(job_id: int, url: UrlOpt = DEFAULT_URL, token: TokenOpt = None) -> None:
    """Cancel a job."""
    with _client(url, token) as client:
        job = _call(client, "POST", f"/jobs/{job_id}/cancel")
        typer.echo(f"job {job_id}: {job['status']}")
