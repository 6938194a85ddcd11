"""How the CLI shows jobs: a table of them (``ls``), one in words (``status``), and a
multi-node job's nodes. Every text a job's submitter or code wrote goes out escaped."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import typer

from service.cli.printable import printable
from trainyard.models import JobRead, JobStatus, Progress

WHAT_CHARS = 24  # a script's command is cut to this in a table
# A job as the client reads it, or the API's JSON of one.
AJob = JobRead | Mapping[str, Any]


def print_jobs(jobs: Sequence[AJob]) -> None:
    """One line per job under a header row: id, status, owner, what, shape, reason."""
    typer.echo(
        f"{'ID':>6}  {'STATUS':<10}  {'OWNER':<12}  {'WHAT':<{WHAT_CHARS}}  {'RUNS':<10}  REASON"
    )
    for job in map(_read, jobs):
        # its first line: a failed script's reason goes on with its last lines on stderr,
        # which `trainyard status` shows
        reason = (job.reason.message if job.reason else "").partition("\n")[0]
        what = _what(job)[:WHAT_CHARS]
        runs = f"{job.strategy} {_shape(job)}"
        typer.echo(
            printable(
                f"{job.id:>6}  {job.status:<10}  {job.owner:<12}  "
                f"{what:<{WHAT_CHARS}}  {runs:<10}  {reason}"
            )
        )


def print_job(job: AJob) -> None:
    """One job in words, a field a line: what it runs, how, where it stands and why."""
    job = _read(job)
    title = f"job {job.id}" + (f"  {job.name}" if job.name else "")
    typer.echo(printable(title))
    for label, value in _details(job):
        for i, line in enumerate(str(value).splitlines() or [""]):
            typer.echo(printable(f"  {label if i == 0 else '':<10} {line}"))


def _read(job: AJob) -> JobRead:
    return job if isinstance(job, JobRead) else JobRead.model_validate(job)


def _details(job: JobRead) -> list[tuple[str, str]]:
    rows = [("status", _status(job))]
    if job.reason:
        rows.append(("reason", f"{job.reason.message} ({job.reason.code})"))
    rows.append(("owner", job.owner))
    if job.sweep_id is not None:
        rows.append(("sweep", f"a trial of sweep {job.sweep_id} (trainyard sweep status)"))
    if job.recipe:
        rows.append(("recipe", job.recipe))
    if job.entrypoint:
        rows.append(("command", " ".join(job.entrypoint)))
    if job.code:
        rows.append(("code", job.code))
    for name, digest in (job.data or {}).items():
        rows.append(("data", f"{name} {digest}"))
    if job.requirements:
        rows.append(("requires", " ".join(job.requirements)))
    if job.params:
        rows.append(("params", json.dumps(job.params, ensure_ascii=True)))
    rows.append(("runs", _runs(job)))
    if not job.entrypoint:  # a script takes its own arguments instead
        rows.append(("trains", _trains(job)))
    rows.append(("attempts", _attempts(job)))
    nodes = node_line(job)
    if nodes:
        rows.append(("nodes", nodes.removeprefix("nodes: ")))
    elif job.worker_id:
        devices = job.assigned_devices  # none on a Slurm worker: Slurm places it
        held = "" if devices is None else f" devices {devices}"
        rows.append(("worker", f"{job.worker_id}{held}"))
    if job.progress:
        rows.append(("progress", _progress(job.progress)))
    if job.result:
        result = ", ".join(f"{k} {_number(v)}" for k, v in job.result.items())
        rows.append(("result", result))
    if job.error:
        error = job.error
        rows.append(("error", f"{error.get('type', '')}: {error.get('message', '')}"))
    for when, at in (
        ("created", job.created_at),
        ("started", job.started_at),
        ("finished", job.finished_at),
    ):
        rows.append((when, moment(at).replace("T", " ")))
    return [(label, value) for label, value in rows if value]


def moment(at: datetime | None, chars: int = 19) -> str:
    """A time as the API writes it, to the second (``chars`` 10: the day); "" for none."""
    return at.isoformat()[:chars] if at is not None else ""


def _status(job: JobRead) -> str:
    if job.status == JobStatus.queued and job.queue_position:
        return f"queued, position {job.queue_position}"
    return str(job.status)


def _runs(job: JobRead) -> str:
    # once an attempt started, what "auto" resolved to, from its environment record
    ran = (job.environment or {}).get("spec") or {}
    strategy = ran.get("strategy") or job.strategy
    accelerator = ran.get("accelerator") or job.accelerator
    memory = f", {job.gpu_memory_gb:g} GiB of one GPU" if job.gpu_memory_gb else ""
    return f"{strategy} {_shape(job)} on {accelerator}{memory}"


def _trains(job: JobRead) -> str:
    return (
        f"{job.epochs} epochs, batch {job.batch_size}, lr {job.lr:g}, "
        f"{job.optimizer}, {job.precision}, seed {job.seed}"
    )


def _attempts(job: JobRead) -> str:
    text = f"{job.attempt} of {job.max_attempts}"
    if job.retries_on_error:
        text += f", retries_on_error {job.retries_on_error}"
    if job.priority:
        text += f"; priority {job.priority}"
    if job.timeout_s:
        text += f"; timeout {job.timeout_s} s each"
    return text


def _progress(p: Progress) -> str:
    text = f"step {p.step}/{p.total_steps}, epoch {p.epoch}/{p.epochs}"
    if p.loss is not None:
        text += f", loss {p.loss:.4g}"
    if p.eta_s is not None:
        text += f", eta {p.eta_s:.0f} s"
    return text


def _number(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _what(job: JobRead) -> str:
    return str(job.recipe or " ".join(job.entrypoint or []))


def _shape(job: JobRead) -> str:
    shape = f"x{job.devices}"
    if job.nodes > 1:  # a job across boxes: devices per box
        shape = f"{job.nodes} boxes {shape}"
    return shape


def node_line(job: JobRead) -> str:
    """A multi-node job's nodes, as "nodes: 0 box-a [0, 1]; 1 box-b [0, 1]" (the worker
    and devices of each), escaped; "" for a one-box job, or one whose gang is empty."""
    nodes = job.node_list or []
    if not nodes:
        return ""
    each = "; ".join(f"{n.node} {n.worker_id} {n.devices}" for n in nodes)
    return printable(f"nodes: {each}")
