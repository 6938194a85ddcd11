"""``trainyard compare``: jobs side by side (the spec fields they differ in, one metric's
last and best value) and that metric's curves overlaid in the terminal."""

from __future__ import annotations

import json
import re
import shutil
import sys
from enum import StrEnum
from typing import Annotated, Any

import typer

from service.cli.api import TokenOpt, UrlOpt, connect
from service.cli.app import app
from service.cli.printable import printable
from trainyard import Client, NotFound
from trainyard.models import JobRead, MetricRead

DEFAULT_METRIC = "train/loss"
JOBS_PAGE = 500  # the most the API lists in one page of jobs
CELL_CHARS = 30  # a spec field's value is cut to this in the table
PLOT_MIN_COLUMNS = 60  # a narrower terminal gets the table only
PLOT_ROWS = 20
LABEL_CHARS = 28  # a curve's label in the legend
# A job's bookkeeping, not its spec: never a field the jobs "differ in".
NOT_SPEC = {
    "id", "name", "owner", "status", "reason", "attempt", "progress", "error", "result",
    "environment", "worker_id", "assigned_devices", "node_list", "queue_position",
    "created_at", "started_at", "finished_at", "sweep_id",
}  # fmt: skip


class Mode(StrEnum):
    min = "min"  # lower is better (a loss)
    max = "max"  # higher is better (an accuracy)


@app.command()
def compare(
    job_ids: Annotated[
        list[int] | None, typer.Argument(help="Jobs to compare.", show_default=False)
    ] = None,
    sweep: Annotated[
        int | None, typer.Option("--sweep", help="Compare every trial of this sweep.")
    ] = None,
    metric: Annotated[
        str | None,
        typer.Option(
            "--metric",
            "-m",
            help="Default: the sweep's metric, else train/loss, else the one metric all "
            "the jobs have.",
            show_default=False,
        ),
    ] = None,
    mode: Annotated[
        Mode | None,
        typer.Option(
            help="Which value is best. Default: the sweep's; else max for an accuracy, min "
            "for anything else.",
            show_default=False,
        ),
    ] = None,
    plot: Annotated[
        bool | None,
        typer.Option(
            "--plot/--no-plot",
            help="Draw the metric's curves. Default: on a terminal wide enough.",
            show_default=False,
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="The comparison as JSON.")] = False,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Compare jobs: the spec fields they differ in, a metric's last and best value, and
    its curves overlaid."""
    if not job_ids and sweep is None:
        typer.echo("error: name the jobs to compare, or a sweep with --sweep ID", err=True)
        raise typer.Exit(2)
    with connect(url, token) as client:
        jobs = _jobs(client, list(dict.fromkeys(job_ids or [])))
        if sweep is not None:
            found = client.sweep(sweep)
            metric = metric or found.spec.get("metric")
            mode = mode or (Mode(found.spec["mode"]) if found.spec.get("mode") else None)
            known = {job.id for job in jobs}
            jobs += [job for job in _trial_jobs(client, sweep) if job.id not in known]
        jobs.sort(key=lambda job: job.id)
        metric, points = _points(client, jobs, metric)
    mode = mode or _default_mode(metric)
    rows = [_summary(job, points[job.id], mode) for job in jobs]
    fields = _differing(jobs)
    if as_json:
        shown = {"metric": metric, "mode": mode.value, "fields": fields, "jobs": rows}
        typer.echo(json.dumps(shown, indent=2, ensure_ascii=True))
        return
    _print_table(jobs, rows, fields, metric, mode)
    for row in rows:
        if row["points"] == 0:
            typer.echo(printable(f"job {row['id']}: no {metric} points"), err=True)
    columns = shutil.get_terminal_size((100, 24)).columns
    tty = sys.stdout.isatty()
    if plot or (plot is None and tty and columns >= PLOT_MIN_COLUMNS):
        _plot(jobs, points, metric, max(columns, PLOT_MIN_COLUMNS), colors=tty)


def _jobs(client: Client, ids: list[int]) -> list[JobRead]:
    """The jobs; every one that does not exist named at once, exit 1."""
    jobs: list[JobRead] = []
    missing = []
    for job_id in ids:
        try:
            jobs.append(client.job(job_id))
        except NotFound:
            missing.append(str(job_id))
    if missing:
        noun = "job" if len(missing) == 1 else "jobs"
        typer.echo(f"error: no {noun} {', '.join(missing)} on this server", err=True)
        raise typer.Exit(1)
    return jobs


def _trial_jobs(client: Client, sweep_id: int) -> list[JobRead]:
    """The jobs of a sweep's trials, every page of them."""
    jobs: list[JobRead] = list(client.jobs(sweep=sweep_id, page_size=JOBS_PAGE))
    # A server without the filter would list every job: refuse rather than mislead.
    if any(job.sweep_id != sweep_id for job in jobs):
        typer.echo(f"error: this server does not list the jobs of sweep {sweep_id}", err=True)
        raise typer.Exit(1)
    return jobs


def _points(
    client: Client, jobs: list[JobRead], metric: str | None
) -> tuple[str, dict[int, list[MetricRead]]]:
    """The metric compared and each job's points of it."""
    if metric is not None:
        return metric, {j.id: client.metrics(j.id, metric) for j in jobs}
    points = {j.id: client.metrics(j.id, DEFAULT_METRIC) for j in jobs}
    if all(points.values()):
        return DEFAULT_METRIC, points
    # Not every job has train/loss (a script's own names): the one metric they all share.
    every = {j.id: client.metrics(j.id) for j in jobs}
    names = [{p.name for p in got} for got in every.values() if got]
    shared = set.intersection(*names) if names else {DEFAULT_METRIC}
    if DEFAULT_METRIC in shared:
        metric = DEFAULT_METRIC
    elif len(shared) == 1:
        (metric,) = shared
    else:
        choices = ", ".join(sorted(shared or set.union(*names)))
        said = "share the metrics" if shared else "share no metric; theirs are"
        typer.echo(printable(f"error: the jobs {said} {choices}: pick one with --metric"), err=True)
        raise typer.Exit(2)
    return metric, {i: [p for p in got if p.name == metric] for i, got in every.items()}


def _default_mode(metric: str) -> Mode:
    return Mode.max if re.search(r"acc(uracy)?\b", metric.lower()) else Mode.min


def _summary(job: JobRead, points: list[MetricRead], mode: Mode) -> dict[str, Any]:
    """A job's row: who it is, the fields of its spec, and the metric's last and best."""
    finite = [(p.step, p.value) for p in points if p.value is not None]
    pick = min if mode is Mode.min else max
    best = pick(finite, key=lambda point: point[1]) if finite else None
    return {
        "id": job.id,
        "name": job.name,
        "status": str(job.status),
        "reason": job.reason.code if job.reason else None,
        "fields": _spec(job),
        "points": len(points),
        # null where the last value was not finite (NaN, infinity)
        "last": points[-1].value if points else None,
        "step": points[-1].step if points else None,
        "best": best[1] if best else None,
        "best_step": best[0] if best else None,
    }


def _spec(job: JobRead) -> dict[str, Any]:
    """The job's spec (as the API writes it), its objects flattened: params.width,
    data.rows.csv."""
    flat: dict[str, Any] = {}
    for key, value in job.model_dump(mode="json").items():
        if key in NOT_SPEC:
            continue
        if isinstance(value, dict):
            flat.update({f"{key}.{k}": v for k, v in value.items()})
        else:
            flat[key] = value
    return flat


def _differing(jobs: list[JobRead]) -> list[str]:
    """The spec fields whose value is not the same in every job, in the spec's order."""
    specs = [_spec(job) for job in jobs]
    keys = list(dict.fromkeys(k for spec in specs for k in spec))
    return [k for k in keys if len({json.dumps(spec.get(k), sort_keys=True) for spec in specs}) > 1]


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list):
        text = " ".join(map(str, value))
    elif isinstance(value, dict):
        text = json.dumps(value, ensure_ascii=True)
    else:
        text = str(value)
    text = printable(text)
    return text if len(text) <= CELL_CHARS else text[: CELL_CHARS - 1] + "…"


def _print_table(
    jobs: list[JobRead],
    rows: list[dict[str, Any]],
    fields: list[str],
    metric: str,
    mode: Mode,
) -> None:
    """A header, then a row per job; the differing fields and the best value stand out."""
    best = [r["best"] for r in rows if r["best"] is not None]
    winner = (min(best) if mode is Mode.min else max(best)) if best else None
    header = ["ID", "NAME", "STATUS", "REASON", *map(printable, fields), "LAST", "BEST", "STEP"]
    table = []
    for row in rows:
        missing = row["points"] == 0
        last = "nan" if not missing and row["last"] is None else _cell(row["last"])
        table.append(
            [
                str(row["id"]),
                _cell(row["name"]),
                _cell(row["status"]),
                _cell(row["reason"]),
                *(_cell(row["fields"].get(f)) for f in fields),
                last,
                _cell(row["best"]),
                _cell(row["step"]),
            ]
        )
    widths = [max(len(line[i]) for line in [header, *table]) for i in range(len(header))]
    numeric = {0, len(header) - 3, len(header) - 2, len(header) - 1}
    spec_columns = range(4, 4 + len(fields))
    typer.echo(printable(f"{metric} ({mode.value} is best) of {len(jobs)} jobs"))

    def line(cells: list[str], styles: dict[int, dict[str, Any]]) -> str:
        out = []
        for i, cell in enumerate(cells):
            text = cell.rjust(widths[i]) if i in numeric else cell.ljust(widths[i])
            out.append(typer.style(text, **styles[i]) if i in styles else text)
        return "  ".join(out).rstrip()

    # colours only on a terminal: typer.echo leaves them out of a pipe
    spec_style: dict[str, Any] = {"fg": "cyan"}
    typer.echo(line(header, {i: {"bold": True, **spec_style} for i in spec_columns}))
    for row, cells in zip(rows, table, strict=True):
        styles = {i: spec_style for i in spec_columns}
        if winner is not None and row["best"] == winner:
            styles[len(header) - 2] = {"fg": "green", "bold": True}
        typer.echo(line(cells, styles))


def _plot(
    jobs: list[JobRead],
    points: dict[int, list[MetricRead]],
    metric: str,
    columns: int,
    *,
    colors: bool,
) -> None:
    """The metric's curve of every job with points, by step, overlaid."""
    import plotext  # here: only a plot needs it

    curves = []
    for job in jobs:
        finite = [(p.step, p.value) for p in points[job.id] if p.value is not None]
        if finite:
            label = printable(f"{job.id} {job.name or ''}".strip())[:LABEL_CHARS]
            curves.append((label, [step for step, _ in finite], [value for _, value in finite]))
    if not curves:
        return
    figure = plotext.figure
    figure.clear()
    figure.theme("simple")  # the terminal's own background; colours for the curves only
    figure.plot_size(columns, PLOT_ROWS)
    figure.title(printable(metric))
    figure.label("step", axis="x")
    for label, steps, values in curves:
        curve = figure.signal(steps, values)
        curve.label(label)
        curve.lines()
        figure.draw(curve)
    typer.echo(figure.build().string(colorless=not colors).rstrip("\n"))
