"""``trainyard sweep``: hyperparameter sweeps on a running server: create one from a file
(and watch its trials), show one, cancel one, list them."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from service.cli.api import TokenOpt, UrlOpt, connect, listing
from service.cli.app import app
from service.cli.inputs import from_job_file, read_mapping, upload_inputs
from service.cli.printable import printable
from trainyard import Client
from trainyard.models import Progress, SweepCounts, SweepRead, SweepStatus, TrialRead

FOLLOW_POLL_S = 1.0
COUNTS = ("queued", "running", "succeeded", "failed", "cancelled", "pruned")
BEST_MARK = "*"

sweep_app = typer.Typer(
    help="Hyperparameter sweeps: trials of one job over a search space.",
    no_args_is_help=True,
)
app.add_typer(sweep_app, name="sweep")


@sweep_app.command()
def create(
    file: Annotated[
        Path,
        typer.Argument(
            help="The sweep (YAML or JSON), as POST /api/v1/sweeps takes it: name, job, "
            "parameters, search, metric, mode, max_trials, max_parallel, pruner. A script "
            "job's code: and data: may name a directory and files relative to the file.",
            dir_okay=False,
            show_default=False,
        ),
    ],
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Watch the trials until the sweep ends.")
    ] = False,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Create a sweep; prints its id (with --follow, exits 0 only if it found a best trial)."""
    body = _sweep_file(file)
    with connect(url, token) as client:
        upload_inputs(client, body["job"])
        sweep = client.submit_sweep(body)
        typer.echo(sweep.id)
        if follow:
            raise typer.Exit(follow_sweep(client, sweep.id))


@sweep_app.command()
def status(
    sweep_id: int,
    as_json: Annotated[
        bool, typer.Option("--json", help="The sweep as the API gives it (for jq, scripts).")
    ] = False,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Show a sweep: its trials, their counts, the best one."""
    with connect(url, token) as client:
        sweep = client.sweep(sweep_id)
    if as_json:
        # ensure_ascii: JSON escapes every control character (and all non-ASCII)
        typer.echo(json.dumps(sweep.model_dump(mode="json"), indent=2, ensure_ascii=True))
        return
    console = Console(soft_wrap=False)
    console.print(trial_table(sweep))
    _print_outcome(console, sweep)


@sweep_app.command()
def cancel(sweep_id: int, url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Cancel a sweep: no new trials, every unfinished one cancelled."""
    with connect(url, token) as client:
        before = client.sweep(sweep_id)
        sweep = client.cancel_sweep(sweep_id)
    unfinished = {t.number for t in before.trials if not t.status.finished}
    stopped = [t for t in sweep.trials if t.number in unfinished]
    line = f"sweep {sweep_id}: {sweep.status}"
    if stopped:
        each = ", ".join(f"{t.number} (job {t.job_id})" for t in stopped)
        line += f"; cancelled trials {each}"
    else:
        line += "; no trial was unfinished"
    typer.echo(printable(line))


@sweep_app.command("ls")
def list_sweeps(
    status_: Annotated[str | None, typer.Option("--status")] = None,
    mine: Annotated[bool, typer.Option("--mine", help="Only your own sweeps.")] = False,
    owner: Annotated[str | None, typer.Option(help="Only this user's sweeps.")] = None,
    limit: int = 20,
    as_json: Annotated[bool, typer.Option("--json", help="The API's page, as JSON.")] = False,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """List sweeps, newest first."""
    with connect(url, token) as client:
        sweeps = client.sweeps_page(**listing(status_, mine, owner), limit=limit).items
    if as_json:
        shown = [sweep.model_dump(mode="json") for sweep in sweeps]
        typer.echo(json.dumps(shown, indent=2, ensure_ascii=True))
        return
    typer.echo(f"{'ID':>6}  {'STATUS':<10}  {'OWNER':<12}  {'NAME':<20}  {'TRIALS':<20}  BEST")
    for sweep in sweeps:
        c = sweep.counts
        active = c.queued + c.running
        trials = f"{c.succeeded}/{c.total} ok" + (f", {active} active" if active else "")
        typer.echo(
            printable(
                f"{sweep.id:>6}  {sweep.status:<10}  {sweep.owner:<12}  "
                f"{(sweep.name or '')[:20]:<20}  {trials:<20}  {_best(sweep)}"
            )
        )


def follow_sweep(client: Client, sweep_id: int) -> int:
    """A live table of the trials until the sweep ends; 0 only if it found a best trial."""
    console = Console(stderr=True, soft_wrap=False)
    try:
        # not a terminal (a pipe, a file): rich draws only the last table, when it stops
        with Live(console=console, auto_refresh=False, redirect_stdout=False) as live:
            while True:
                sweep = client.sweep(sweep_id)
                live.update(trial_table(sweep), refresh=True)
                if sweep.status != SweepStatus.running:
                    break
                time.sleep(FOLLOW_POLL_S)
    except KeyboardInterrupt:
        _end_line(console)
        console.print(
            f"stopped watching; sweep {sweep_id} goes on. Cancel it with: "
            f"trainyard sweep cancel {sweep_id}",
            markup=False,
        )
        return 130
    _end_line(console)
    _print_outcome(console, sweep)
    return 0 if sweep.status == SweepStatus.finished and sweep.best else 1


def _end_line(console: Console) -> None:
    if not console.is_terminal:  # there rich ends Live's last table without a newline
        console.line()


def trial_table(sweep: SweepRead) -> Table:
    """The sweep's trials a row each: values, status, the metric's last and best, epoch."""
    spec = sweep.spec or {}
    metric, mode = spec.get("metric", "metric"), spec.get("mode", "")
    names = list(spec.get("parameters") or {})
    for trial in sweep.trials:  # a space the spec no longer shows: its values' names
        names += [n for n in trial.values if n not in names]
    best = sweep.best.number if sweep.best else None
    title = f"sweep {sweep.id}" + (f" {sweep.name}" if sweep.name else "")
    table = Table(
        title=Text(printable(f"{title}: {sweep.status}, {metric} {mode}")),
        caption=Text(printable(_counts(sweep.counts))),
    )
    table.add_column("#", justify="right")
    for name in names:
        table.add_column(Text(printable(name)), justify="right")
    table.add_column("status")
    table.add_column("last", justify="right")
    table.add_column("best", justify="right")
    table.add_column("epoch", justify="right")
    table.add_column("job", justify="right")
    for trial in sweep.trials:
        marked = trial.number == best
        cells = [
            f"{trial.number}{BEST_MARK if marked else ''}",
            *(_value(trial.values.get(name)) for name in names),
            _trial_status(trial),
            _value(trial.last),
            _value(trial.best),
            _epoch(trial.progress),
            str(trial.job_id or "-"),
        ]
        # Text: "[...]" in a value or name is the user's text, not rich's markup
        table.add_row(*(Text(printable(c)) for c in cells), style="bold" if marked else None)
    return table


def _print_outcome(console: Console, sweep: SweepRead) -> None:
    """How the sweep stands or ended, and its best trial."""
    lines = [f"sweep {sweep.id} {sweep.status}: {_counts(sweep.counts)}"]
    if sweep.reason:
        lines.append(f"  reason: {sweep.reason.message} ({sweep.reason.code})")
    lines.append(f"  best: {_best(sweep, values=True)}")
    console.print(Group(*(Text(printable(line)) for line in lines)), soft_wrap=True)


def _best(sweep: SweepRead, values: bool = False) -> str:
    best = sweep.best
    if not best:
        return "-"
    metric = (sweep.spec or {}).get("metric", "metric")
    # trials are ranked by the metric's last value, the one the search was told
    text = f"trial {best.number} {metric} {_value(best.last)}"
    if values:
        chosen = ", ".join(f"{k}={_value(v)}" for k, v in best.values.items())
        text += f" (best seen {_value(best.best)}; {chosen}; job {best.job_id})"
    return text


def _counts(counts: SweepCounts) -> str:
    shown = ", ".join(f"{getattr(counts, k)} {k}" for k in COUNTS if getattr(counts, k))
    return f"{counts.total} trials" + (f": {shown}" if shown else "")


def _trial_status(trial: TrialRead) -> str:
    return "pruned" if trial.pruned else str(trial.status)


def _epoch(progress: Progress | None) -> str:
    if not progress or not progress.epochs:
        return "-"
    return f"{progress.epoch}/{progress.epochs}"


def _value(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _sweep_file(file: Path) -> dict[str, Any]:
    """A sweep file's body; its job's code and data paths made relative to the file."""
    loaded = read_mapping(file, "sweep fields")
    if not isinstance(loaded.get("job"), dict):
        raise typer.BadParameter(f"{file}: job: must be a mapping of job fields")
    from_job_file(loaded["job"], file.parent)
    return loaded
