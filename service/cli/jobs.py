"""Talking to a Trainyard server over HTTP: submit, ls, status, logs, cancel.

One module past ~300 lines: the commands share how a job is shown (its line, its
nodes, its progress while followed) and how the server's errors are printed; the
packing and upload of a code package are apart, in ``pack.py`` and ``blobs.py``."""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
import yaml
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from service.cli.app import app
from service.cli.blobs import upload
from service.cli.http import DEFAULT_URL, TokenOpt, UrlOpt, call, connect
from service.cli.pack import Packed, PackError, pack
from service.cli.printable import printable
from service.settings import Settings

TERMINAL = {"succeeded", "failed", "cancelled"}
DEFAULT_CODE_LIMIT = Settings.model_fields["max_code_bytes"].default
PACKAGE_WARN_BYTES = DEFAULT_CODE_LIMIT // 2
FOLLOW_POLL_S = 0.5


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
    args: Annotated[
        list[str] | None,
        typer.Argument(
            help="A job spec file (YAML or JSON); with --code, the command to run, after --.",
            show_default=False,
        ),
    ] = None,
    recipe: Annotated[str | None, typer.Option(help="Recipe (instead of a file).")] = None,
    code: Annotated[
        Path | None,
        typer.Option(
            help="Run your own script: this directory is packed (honouring .gitignore and "
            ".trainyardignore) and uploaded; give the command after --.",
            file_okay=False,
        ),
    ] = None,
    data: Annotated[
        list[str] | None,
        typer.Option(help="NAME=FILE: upload FILE, placed at $TRAINYARD_INPUT_DIR/NAME."),
    ] = None,
    requirements: Annotated[
        Path | None,
        typer.Option(
            help="pip requirements file for the script (default: the package's).", dir_okay=False
        ),
    ] = None,
    param: Annotated[list[str] | None, typer.Option("--param", "-p", help="key=value")] = None,
    strategy: Annotated[str | None, typer.Option()] = None,
    devices: Annotated[int | None, typer.Option()] = None,
    nodes: Annotated[
        int | None,
        typer.Option(
            help="Boxes the job spans, each with --devices: one DDP world (strategy ddp) "
            "across workers sharing a PostgreSQL database. Default 1.",
            show_default=False,
        ),
    ] = None,
    accelerator: Annotated[str | None, typer.Option()] = None,
    gpu_memory_gb: Annotated[
        float | None,
        typer.Option(help="Share one GPU with other jobs: GiB of its memory (devices 1)."),
    ] = None,
    epochs: Annotated[int | None, typer.Option()] = None,
    batch_size: Annotated[int | None, typer.Option()] = None,
    name: Annotated[str | None, typer.Option()] = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Watch until it ends.")] = False,
    url: UrlOpt = DEFAULT_URL,
    token: TokenOpt = None,
) -> None:
    """Submit a job; prints its id (with --follow, exits 0 only if it succeeds)."""
    spec: dict[str, Any] = {}
    file = None
    if code is None and args:
        if len(args) > 1:
            raise typer.BadParameter("give one spec file (a command needs --code)")
        file = Path(args[0])
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
        "nodes": nodes,
        "accelerator": accelerator,
        "gpu_memory_gb": gpu_memory_gb,
        "epochs": epochs,
        "batch_size": batch_size,
        "name": name,
    }
    spec.update({k: v for k, v in options.items() if v is not None})
    if param:
        spec["params"] = {**spec.get("params", {}), **dict(_parse_param(p) for p in param)}
    if code is not None:
        if not args:
            raise typer.BadParameter("give the command to run after --, e.g. -- python train.py")
        spec["entrypoint"] = list(args)
        if requirements is not None:
            spec["requirements"] = requirements.read_text().splitlines()
    elif data or requirements:
        raise typer.BadParameter("--data and --requirements are for scripts (give --code)")
    elif "recipe" not in spec and "entrypoint" not in spec:
        raise typer.BadParameter("give a spec file, --recipe, or --code DIR -- COMMAND")
    with connect(url, token) as client:
        if code is not None:
            spec.update(_upload_inputs(client, code, data or []))
        job = call(client, "POST", "/jobs", json=spec)
        typer.echo(job["id"])
        if follow:
            raise typer.Exit(_follow(client, job["id"]))


def _upload_inputs(client: httpx.Client, code: Path, data: list[str]) -> dict[str, Any]:
    """Pack and upload the code, upload the data files: their digests, as spec fields."""
    console = Console(stderr=True)
    files: dict[str, Path] = {}
    for item in data:
        name, sep, path = item.partition("=")
        if not sep or not name:
            raise typer.BadParameter(f"--data wants NAME=FILE, got {item!r}")
        files[name] = Path(path)
        if not files[name].is_file():
            raise typer.BadParameter(f"--data {name}: no such file {path}")
    with tempfile.TemporaryDirectory(prefix="trainyard-pack-") as tmp:
        try:
            packed = pack(code, Path(tmp) / "package.zip")
        except PackError as exc:
            raise typer.BadParameter(str(exc), param_hint="--code") from exc
        _warn_if_large(console, packed, code)
        digest = upload(client, packed.path, label=f"code {code}", console=console)
    return {
        "code": digest,
        "data": {
            name: upload(client, path, label=f"data {name}", console=console)
            for name, path in files.items()
        }
        or None,
    }


def _warn_if_large(console: Console, packed: Packed, code: Path) -> None:
    """Past half the server's default limit, say which files make it big."""
    total = packed.path.stat().st_size
    if total < PACKAGE_WARN_BYTES:
        return
    largest = sorted(packed.files, key=lambda f: -f[1])[:5]
    names = ", ".join(f"{name} ({size / 2**20:.1f} MiB)" for name, size in largest)
    console.print(
        f"[yellow]warning:[/] the package of {code} is {total / 2**20:.1f} MiB (the server's "
        f"default limit is {DEFAULT_CODE_LIMIT // 2**20} MiB); largest files: {names}. Leave "
        "data out with .trainyardignore and pass it with --data."
    )


def _follow(client: httpx.Client, job_id: int) -> int:
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
            job = call(client, "GET", f"/jobs/{job_id}")
            nodes = node_line(job)
            if nodes and nodes != shown_nodes:  # a gang forming, or the nodes it runs on
                console.print(nodes, markup=False)
                shown_nodes = nodes
            p = job.get("progress") or {}
            bar.update(
                task,
                total=p.get("total_steps") or None,
                completed=p.get("step", 0),
                status=printable(job["status"]),
                epoch=f"{p['epoch']}/{p['epochs']}" if p else "-",
                loss=f"{p['loss']:.4g}" if p.get("loss") is not None else "-",
                eta=f"{p['eta_s']:.0f}s" if p.get("eta_s") is not None else "-",
            )
            if job["status"] in TERMINAL:
                break
            time.sleep(FOLLOW_POLL_S)
    reason = (job.get("reason") or {}).get("message", "")
    # markup off: "[...]" in a reason is the job's text, not rich's styling
    console.print(printable(f"job {job_id} {job['status']}: {reason}"), markup=False)
    return 0 if job["status"] == "succeeded" else 1


def node_line(job: dict[str, Any]) -> str:
    """A multi-node job's nodes, as "nodes: 0 box-a [0, 1]; 1 box-b [0, 1]" (the worker
    and devices of each), escaped; "" for a one-box job, or one whose gang is empty."""
    nodes = job.get("node_list") or []
    if not nodes:
        return ""
    each = "; ".join(f"{n['node']} {n['worker_id']} {n['devices']}" for n in nodes)
    return printable(f"nodes: {each}")


@app.command()
def status(
    job_id: Annotated[int | None, typer.Argument()] = None,
    url: UrlOpt = DEFAULT_URL,
    token: TokenOpt = None,
) -> None:
    """Show one job in full, or the newest jobs."""
    with connect(url, token) as client:
        if job_id is not None:
            job = call(client, "GET", f"/jobs/{job_id}")
            # ensure_ascii: JSON escapes every control character (and all non-ASCII)
            typer.echo(json.dumps(job, indent=2, ensure_ascii=True))
            nodes = node_line(job)
            if nodes:  # on stderr: stdout stays one JSON document, for jq and scripts
                typer.echo(nodes, err=True)
            return
        _print_jobs(call(client, "GET", "/jobs", params={"limit": 20})["items"])


@app.command("ls")
def list_jobs(
    status_: Annotated[str | None, typer.Option("--status")] = None,
    mine: Annotated[bool, typer.Option("--mine", help="Only your own jobs.")] = False,
    owner: Annotated[str | None, typer.Option(help="Only this user's jobs.")] = None,
    limit: int = 20,
    url: UrlOpt = DEFAULT_URL,
    token: TokenOpt = None,
) -> None:
    """List jobs, newest first: everyone's, or one user's."""
    params: dict[str, Any] = {"limit": limit}
    if status_:
        params["status"] = status_
    if mine or owner:
        params["owner"] = "me" if mine else owner
    with connect(url, token) as client:
        _print_jobs(call(client, "GET", "/jobs", params=params)["items"])


def _print_jobs(jobs: list[dict[str, Any]]) -> None:
    for job in jobs:
        reason = (job.get("reason") or {}).get("message", "")
        what = job["recipe"] or " ".join(job["entrypoint"] or [])[:20]
        shape = f"x{job['devices']}"
        if job["nodes"] > 1:  # a job across boxes: devices per box
            shape = f"{job['nodes']} boxes {shape}"
        typer.echo(
            printable(
                f"{job['id']:>6}  {job['status']:<10}  {job['owner']:<12}  {what:<20}  "
                f"{job['strategy']:<6} {shape}  {reason}"
            )
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
    with connect(url, token) as client:
        while True:
            lines = call(client, "GET", f"/jobs/{job_id}/logs", params={"after_seq": after})
            for line in lines:
                typer.echo(printable(line["text"]))
                after = line["seq"]
            if not follow:
                return
            if not lines and call(client, "GET", f"/jobs/{job_id}")["status"] in TERMINAL:
                # one more read: lines may have landed between the two calls
                for line in call(
                    client, "GET", f"/jobs/{job_id}/logs", params={"after_seq": after}
                ):
                    typer.echo(printable(line["text"]))
                return
            if not lines:
                time.sleep(FOLLOW_POLL_S)


@app.command()
def cancel(job_id: int, url: UrlOpt = DEFAULT_URL, token: TokenOpt = None) -> None:
    """Cancel a job."""
    with connect(url, token) as client:
        job = call(client, "POST", f"/jobs/{job_id}/cancel")
        typer.echo(printable(f"job {job_id}: {job['status']}"))
