"""``trainyard export``: a job's metrics, or every trial's of a sweep, as TensorBoard
event files (one run folder per job), written with TensorBoard's own writer."""

from __future__ import annotations

import json
import math
import re
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Annotated, Any

import typer

from service.cli.api import TokenOpt, UrlOpt, connect
from service.cli.app import app
from service.cli.printable import printable
from trainyard import Client
from trainyard.models import JobRead

EVENT_FILES = "tfevents"  # what TensorBoard reads in a run folder: names holding this
NAME_CHARS = 60  # a job's name in its run folder's, cut to this
EVENT_QUEUE = 1000  # points the writer's thread may lag behind


@app.command()
def export(
    tensorboard: Annotated[
        Path,
        typer.Option(
            "--tensorboard",
            help="Write TensorBoard event files here, a run folder per job "
            "(then: tensorboard --logdir DIR).",
            file_okay=False,
            show_default=False,
        ),
    ],
    job_id: Annotated[int | None, typer.Argument(help="The job to export.")] = None,
    sweep: Annotated[
        int | None, typer.Option("--sweep", help="Export every trial of this sweep.")
    ] = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Export a job's metrics (or every trial's of a sweep, with its values as hparams)
    as TensorBoard event files; run again, it replaces what it wrote."""
    if (job_id is None) == (sweep is None):
        typer.echo("error: name one job, or a sweep with --sweep ID", err=True)
        raise typer.Exit(2)
    tb = _tensorboard()
    with connect(url, token) as client:
        runs: list[tuple[str, int, dict[str, Any] | None]]
        if sweep is not None:
            runs = [
                (f"trial-{t.number:03d}-job-{job}", job, t.values)
                for t in client.sweep(sweep).trials
                if (job := t.job_id) is not None  # a trial never started has no metrics
            ]
        elif job_id is not None:
            runs = [(_job_folder(client.job(job_id)), job_id, None)]
        for folder, job, hparams in runs:
            count, tags = _write_run(client, tb, tensorboard / folder, job, hparams)
            typer.echo(printable(f"{tensorboard / folder}: {count} points of {tags} metrics"))
    typer.echo(printable(f"view them with: tensorboard --logdir {tensorboard}"))


def _tensorboard() -> SimpleNamespace:
    """TensorBoard's writer and protos, imported here: an optional extra."""
    try:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary
        from tensorboard.plugins.hparams.summary_v2 import hparams_pb
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
    except ImportError as exc:
        typer.echo(
            f"error: exporting needs TensorBoard ({exc}): pip install 'trainyard[tensorboard]'",
            err=True,
        )
        raise typer.Exit(1) from exc
    return SimpleNamespace(
        Event=Event, Summary=Summary, hparams_pb=hparams_pb, EventFileWriter=EventFileWriter
    )


def _job_folder(job: JobRead) -> str:
    """job-12, or job-12-<its name> with what a path should not hold replaced."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", job.name or "").strip("-.")[:NAME_CHARS]
    return f"job-{job.id}" + (f"-{name}" if name else "")


def _write_run(
    client: Client,
    tb: SimpleNamespace,
    folder: Path,
    job_id: int,
    hparams: dict[str, Any] | None,
) -> tuple[int, int]:
    """A job's points into a new event file in ``folder``, which replaces the event files
    an earlier export left there once it is whole; (points, metrics) written."""
    folder.mkdir(parents=True, exist_ok=True)
    earlier = {p for p in folder.iterdir() if EVENT_FILES in p.name}
    writer = tb.EventFileWriter(str(folder), max_queue_size=EVENT_QUEUE)
    count, tags = 0, set()
    try:
        if hparams is not None:
            summary = tb.hparams_pb(_hparam_values(hparams), trial_id=folder.name)
            writer.add_event(tb.Event(wall_time=time.time(), step=0, summary=summary))
        # Points come in step order across metrics: TensorBoard drops what it reads
        # after a step that went back (it takes that for a restart).
        for point in client.metrics(job_id):
            value = math.nan if point.value is None else point.value
            scalar = tb.Summary.Value(tag=point.name, simple_value=value)
            writer.add_event(
                tb.Event(
                    wall_time=point.time,
                    step=point.step,
                    summary=tb.Summary(value=[scalar]),
                )
            )
            count += 1
            tags.add(point.name)
    except BaseException:
        writer.close()
        for path in folder.iterdir():  # no half export beside the last one
            if EVENT_FILES in path.name and path not in earlier:
                path.unlink()
        raise
    writer.close()
    for path in earlier:
        path.unlink()
    return count, len(tags)


def _hparam_values(values: dict[str, Any]) -> dict[str, bool | int | float | str]:
    """A trial's values as TensorBoard takes them: a number, a bool or a string."""
    return {
        name: value if isinstance(value, bool | int | float | str) else json.dumps(value)
        for name, value in values.items()
    }
