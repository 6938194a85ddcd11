"""How the CLI shows jobs: a table of them (``ls``), one in words (``status``), and a
multi-node job's nodes. Every text a job's submitter or code wrote goes out escaped."""

from __future__ import annotations

import json
from typing import Any

import typer

from service.cli.printable import printable

WHAT_CHARS = 24  # a script's command is cut to this in a table


def print_jobs(jobs: list[dict[str, Any]]) -> None:
    """One line per job under a header row: id, status, owner, what, shape, reason."""
    typer.echo(
        f"{'ID':>6}  {'STATUS':<10}  {'OWNER':<12}  {'WHAT':<{WHAT_CHARS}}  {'RUNS':<10}  REASON"
    )
    for job in jobs:
        # its first line: a failed script's reason goes on with its last lines on stderr,
        # which `trainyard status` shows
        reason = (job.get("reason") or {}).get("message", "").partition("\n")[0]
        what = _what(job)[:WHAT_CHARS]
        runs = f"{job['strategy']} {_shape(job)}"
        typer.echo(
            printable(
                f"{job['id']:>6}  {job['status']:<10}  {job['owner']:<12}  "
                f"{what:<{WHAT_CHARS}}  {runs:<10}  {reason}"
            )
        )


def print_job(job: dict[str, Any]) -> None:
    """One job in words, a field a line: what it runs, how, where it stands and why."""
    title = f"job {job['id']}" + (f"  {job['name']}" if job.get("name") else "")
    typer.echo(printable(title))
    for label, value in _details(job):
        for i, line in enumerate(str(value).splitlines() or [""]):
            typer.echo(printable(f"  {label if i == 0 else '':<10} {line}"))


def _details(job: dict[str, Any]) -> list[tuple[str, str]]:
    rows = [("status", _status(job))]
    if job.get("reason"):
        rows.append(("reason", f"{job['reason']['message']} ({job['reason']['code']})"))
    rows.append(("owner", job["owner"]))
    if job.get("sweep_id") is not None:
        rows.append(("sweep", f"a trial of sweep {job['sweep_id']} (trainyard sweep status)"))
    if job.get("recipe"):
        rows.append(("recipe", job["recipe"]))
    if job.get("entrypoint"):
        rows.append(("command", " ".join(job["entrypoint"])))
    if job.get("code"):
        rows.append(("code", job["code"]))
    for name, digest in (job.get("data") or {}).items():
        rows.append(("data", f"{name} {digest}"))
    if job.get("requirements"):
        rows.append(("requires", " ".join(job["requirements"])))
    if job.get("params"):
        rows.append(("params", json.dumps(job["params"], ensure_ascii=True)))
    rows.append(("runs", _runs(job)))
    if not job.get("entrypoint"):  # a script takes its own arguments instead
        rows.append(("trains", _trains(job)))
    rows.append(("attempts", _attempts(job)))
    nodes = node_line(job)
    if nodes:
        rows.append(("nodes", nodes.removeprefix("nodes: ")))
    elif job.get("worker_id"):
        devices = job.get("assigned_devices")  # none on a Slurm worker: Slurm places it
        held = "" if devices is None else f" devices {devices}"
        rows.append(("worker", f"{job['worker_id']}{held}"))
    if job.get("progress"):
        rows.append(("progress", _progress(job["progress"])))
    if job.get("result"):
        result = ", ".join(f"{k} {_number(v)}" for k, v in job["result"].items())
        rows.append(("result", result))
    if job.get("error"):
        error = job["error"]
        rows.append(("error", f"{error.get('type', '')}: {error.get('message', '')}"))
    for when in ("created", "started", "finished"):
        at = job.get(f"{when}_at")
        rows.append((when, at[:19].replace("T", " ") if at else ""))
    return [(label, value) for label, value in rows if value]


def _status(job: dict[str, Any]) -> str:
    if job["status"] == "queued" and job.get("queue_position"):
        return f"queued, position {job['queue_position']}"
    return str(job["status"])


def _runs(job: dict[str, Any]) -> str:
    # once an attempt started, what "auto" resolved to, from its environment record
    ran = (job.get("environment") or {}).get("spec") or {}
    strategy, accelerator = (ran.get(k) or job[k] for k in ("strategy", "accelerator"))
    memory = f", {job['gpu_memory_gb']:g} GiB of one GPU" if job.get("gpu_memory_gb") else ""
    return f"{strategy} {_shape(job)} on {accelerator}{memory}"


def _trains(job: dict[str, Any]) -> str:
    return (
        f"{job['epochs']} epochs, batch {job['batch_size']}, lr {job['lr']:g}, "
        f"{job['optimizer']}, {job['precision']}, seed {job['seed']}"
    )


def _attempts(job: dict[str, Any]) -> str:
    text = f"{job['attempt']} of {job['max_attempts']}"
    if job.get("retries_on_error"):
        text += f", retries_on_error {job['retries_on_error']}"
    if job.get("priority"):
        text += f"; priority {job['priority']}"
    if job.get("timeout_s"):
        text += f"; timeout {job['timeout_s']} s each"
    return text


def _progress(p: dict[str, Any]) -> str:
    text = f"step {p['step']}/{p['total_steps']}, epoch {p['epoch']}/{p['epochs']}"
    if p.get("loss") is not None:
        text += f", loss {p['loss']:.4g}"
    if p.get("eta_s") is not None:
        text += f", eta {p['eta_s']:.0f} s"
    return text


def _number(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _what(job: dict[str, Any]) -> str:
    return str(job["recipe"] or " ".join(job["entrypoint"] or []))


def _shape(job: dict[str, Any]) -> str:
    shape = f"x{job['devices']}"
    if job["nodes"] > 1:  # a job across boxes: devices per box
        shape = f"{job['nodes']} boxes {shape}"
    return shape


def node_line(job: dict[str, Any]) -> str:
    """A multi-node job's nodes, as "nodes: 0 box-a [0, 1]; 1 box-b [0, 1]" (the worker
    and devices of each), escaped; "" for a one-box job, or one whose gang is empty."""
    nodes = job.get("node_list") or []
    if not nodes:
        return ""
    each = "; ".join(f"{n['node']} {n['worker_id']} {n['devices']}" for n in nodes)
    return printable(f"nodes: {each}")
