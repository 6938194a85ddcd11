"""``trainyard submit``: a job from a file, from options, or both (options win); a recipe,
a script in a directory of your own (``--code DIR -- COMMAND``), or a recipe that
directory defines (``--code DIR --recipe NAME``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from service.cli.api import TokenOpt, UrlOpt, connect
from service.cli.app import app
from service.cli.inputs import data_option, from_job_file, read_mapping, upload_inputs
from service.cli.jobs import follow_job


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
            help="A job file (YAML or JSON); with --code, the command to run, after --.",
            show_default=False,
        ),
    ] = None,
    recipe: Annotated[
        str | None,
        typer.Option(help="Recipe to train; with --code, one the package defines."),
    ] = None,
    code: Annotated[
        Path | None,
        typer.Option(
            help="Your own code: this directory is packed (honouring .gitignore and "
            ".trainyardignore) and uploaded; give the command after --, or --recipe for "
            "a recipe of its trainyard_recipes.py.",
            file_okay=False,
        ),
    ] = None,
    data: Annotated[
        list[str] | None,
        typer.Option(
            help="FILE or NAME=FILE: upload FILE, placed at $TRAINYARD_INPUT_DIR/NAME "
            "(default: the file's own name).",
            show_default=False,
        ),
    ] = None,
    requirements: Annotated[
        Path | None,
        typer.Option(
            help="pip requirements file for the script (default: the package's).",
            dir_okay=False,
            exists=True,
        ),
    ] = None,
    param: Annotated[list[str] | None, typer.Option("--param", "-p", help="key=value")] = None,
    strategy: Annotated[str | None, typer.Option()] = None,
    devices: Annotated[int | None, typer.Option()] = None,
    nodes: Annotated[
        int | None,
        typer.Option(
            help="Boxes the job spans, each with --devices: one DDP world (strategy ddp) "
            "across workers sharing a PostgreSQL database, or across a Slurm worker's "
            "nodes. Default 1.",
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
    lr: Annotated[float | None, typer.Option(help="Learning rate.")] = None,
    seed: Annotated[int | None, typer.Option(help="Same spec and seed: same weights.")] = None,
    priority: Annotated[
        int | None, typer.Option(help="-100..100, higher runs first (default 0).")
    ] = None,
    retries_on_error: Annotated[
        int | None,
        typer.Option(
            help="Retry the job's own failure (an exception, a non-zero exit) up to N "
            "times, within its attempts (default 0).",
            metavar="N",
        ),
    ] = None,
    name: Annotated[str | None, typer.Option()] = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Watch until it ends.")] = False,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Submit a job; prints its id (with --follow, exits 0 only if it succeeds)."""
    spec: dict[str, Any] = {}
    if code is None and args:
        if len(args) > 1:
            raise typer.BadParameter("give one job file (a command needs --code)")
        spec = _job_file(Path(args[0]))
    options = {
        "recipe": recipe,
        "strategy": strategy,
        "devices": devices,
        "nodes": nodes,
        "accelerator": accelerator,
        "gpu_memory_gb": gpu_memory_gb,
        "epochs": epochs,
        "batch_size": batch_size,
        "lr": lr,
        "seed": seed,
        "priority": priority,
        "retries_on_error": retries_on_error,
        "name": name,
    }
    spec.update({k: v for k, v in options.items() if v is not None})
    if param:
        spec["params"] = {**spec.get("params", {}), **dict(_parse_param(p) for p in param)}
    if code is not None:
        _code_option(spec, code, args or [])
    if data:
        spec["data"] = {**(spec.get("data") or {}), **data_option(data)}
    if requirements is not None:
        spec["requirements"] = requirements.read_text().splitlines()
    if spec.get("code") is None and (spec.get("data") or spec.get("requirements")):
        raise typer.BadParameter("data and requirements are for jobs with code: give --code DIR")
    if "recipe" not in spec and "entrypoint" not in spec:
        raise typer.BadParameter(
            "give a job file, --recipe NAME, or --code DIR with a command after -- (or with "
            "--recipe NAME for a recipe of the package)"
        )
    with connect(url, token) as client:
        upload_inputs(client, spec)
        job = client.submit(spec)
        typer.echo(job.id)
        if follow:
            raise typer.Exit(follow_job(client, job.id))


def _job_file(file: Path) -> dict[str, Any]:
    """The fields of a YAML or JSON job file, its paths made relative to where it lies."""
    loaded = read_mapping(file, "job fields")
    from_job_file(loaded, file.parent)
    return loaded


def _code_option(spec: dict[str, Any], code: Path, command: list[str]) -> None:
    """``--code DIR``: a script with the command after ``--``, or a recipe of the package."""
    if command and spec.get("recipe"):
        raise typer.BadParameter(
            "--recipe runs a recipe of the package, a command after -- runs a script: give one"
        )
    if not command and not spec.get("recipe"):
        raise typer.BadParameter(
            "give the command to run after -- (e.g. -- python train.py), or --recipe NAME "
            "for a recipe the package's trainyard_recipes.py defines"
        )
    spec["code"] = code
    if command:
        spec["entrypoint"] = list(command)
