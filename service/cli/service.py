"""Running the service on this box: migrate, serve, worker, and up (API + one worker).

The composition root: the API's modules never import ``workers`` or torch; the
``worker`` command does, inside the function, so the other commands stay light.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated

import typer

from service.cli.app import app
from service.owner_only import hide_process, keep_private
from service.settings import Settings


@app.command()
def migrate() -> None:
    """Create or upgrade the database schema."""
    from service.migrate import shown_url, upgrade

    settings = Settings()
    keep_private(settings)  # before the database file is made
    upgrade(settings.database_url)
    typer.echo(f"database at {shown_url(settings.database_url)} is up to date")


def _require_current_schema(settings: Settings) -> None:
    """Refuse to start on a database whose schema is not this code's, saying what to run.

    Not migrating here is deliberate: several API processes and workers on other boxes
    start against one database, and would race to migrate it; and a migration (SQLite's
    rewrites whole tables) is the operator's step, after a backup, not a side effect of a
    restart with newer code. ``up``, the single-box default, migrates first.
    """
    from sqlalchemy.exc import DBAPIError

    from service.db import make_engine
    from service.migrate import schema_state, shown_url

    engine = make_engine(settings)
    try:
        with engine.connect() as conn:
            state = schema_state(conn)
    except DBAPIError as exc:
        # Down for now: start anyway, as on any outage; /healthz says when it is back,
        # and what its schema is.
        first_line = str(exc.orig or exc).splitlines()[0][:300]
        typer.echo(f"warning: cannot read the database's schema revision: {first_line}", err=True)
        return
    finally:
        engine.dispose()
    problem = state.problem()
    if problem is not None:
        typer.echo(f"error: {problem} (database {shown_url(settings.database_url)})", err=True)
        raise typer.Exit(1)


@app.command()
def serve() -> None:
    """Serve the API (TRAINYARD_HOST, TRAINYARD_PORT)."""
    import uvicorn

    from service.app import serving_app

    settings = Settings()
    keep_private(settings)
    hide_process()  # its environment holds the token and the database URL
    settings.require_safe_bind()
    _require_current_schema(settings)
    if settings.api_workers == 1:
        app = serving_app(settings)
        uvicorn.run(
            app,
            host=settings.host,
            port=settings.port,
            log_level="info",
            access_log=settings.access_log,
        )
        return
    # Several processes: each builds its app from the same environment.
    uvicorn.run(
        "service.app:serving_app",
        factory=True,
        workers=settings.api_workers,
        host=settings.host,
        port=settings.port,
        log_level="info",
        access_log=settings.access_log,
    )


class Executor(StrEnum):
    """Where a worker runs its jobs (workers.executor)."""

    box = "box"
    slurm = "slurm"


@app.command()
def worker(
    drain: Annotated[bool, typer.Option(help="Exit once no runnable job is left.")] = False,
    worker_id: Annotated[str | None, typer.Option(help="Stable name; default hostname.")] = None,
    executor: Annotated[
        Executor,
        typer.Option(
            help="box: run jobs on this box's devices; slurm: submit them to the Slurm "
            "cluster this host submits to (TRAINYARD_SLURM_* settings).",
        ),
    ] = Executor.box,
) -> None:
    """Run a worker on this box's GPUs (or CPU slots), or in front of a Slurm cluster."""
    import logging

    settings = Settings()
    keep_private(settings)  # inherited by the zygote, runners, ranks and scripts
    hide_process()  # from its jobs: their code runs as this user
    _require_current_schema(settings)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # The composition root: the API modules never import workers or torch; this command does.
    if executor == Executor.slurm:
        if drain:
            raise typer.BadParameter("--drain is for a box's worker", param_hint="--drain")
        from workers.slurm.worker import SlurmWorker

        slurm = SlurmWorker(settings, worker_id=worker_id)
        slurm.install_signal_handlers()
        slurm.run()
        return
    from workers.supervisor.loop import Supervisor

    supervisor = Supervisor(settings, worker_id=worker_id)
    supervisor.install_signal_handlers()
    supervisor.run(drain=drain)


# How long `up` waits for its worker to register before it serves anyway: the worker
# imports torch and finds its devices first (seconds; a minute on a slow disk).
WORKER_REGISTERS_IN_S = 120.0


def _await_worker(settings: Settings, since: datetime, proc: subprocess.Popen[bytes]) -> None:
    """Wait until the worker ``proc`` has registered (a row of its id started since
    ``since``): until then a submit naming one of its recipes would be refused as
    unknown. Exit if it dies first; serve anyway, saying so, past the deadline."""
    import platform

    from sqlmodel import Session

    from service.db import make_engine
    from service.models import Worker

    worker_id = settings.worker_id or platform.node()
    typer.echo(f"waiting for worker {worker_id} to register", err=True)
    engine = make_engine(settings)
    deadline = time.monotonic() + WORKER_REGISTERS_IN_S
    try:
        while time.monotonic() < deadline:
            with Session(engine) as session:
                row = session.get(Worker, worker_id)
                if row is not None and row.started_at >= since:
                    return
            if proc.poll() is not None:
                typer.echo(f"error: the worker exited with {proc.returncode}", err=True)
                raise typer.Exit(1)
            time.sleep(0.2)
        typer.echo(
            f"warning: worker {worker_id} has not registered in {WORKER_REGISTERS_IN_S:.0f}s; "
            "serving anyway (jobs wait for it)",
            err=True,
        )
    finally:
        engine.dispose()


@app.command()
def up() -> None:
    """Migrate, start one worker, and once it has registered serve the API beside it (the
    single-box default)."""
    migrate()
    settings = Settings()
    since = datetime.now(UTC)
    worker_proc = subprocess.Popen([sys.executable, "-m", "service.cli", "worker"])
    # uvicorn shuts down gracefully on SIGTERM, then raises the signal again: with the
    # default action this process would die there, before stopping its worker, which
    # would run on, orphaned. Exit through `finally` instead.
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    try:
        _await_worker(settings, since, worker_proc)
        serve()
    finally:
        worker_proc.terminate()  # the worker hands its running jobs back to the queue
        try:
            worker_proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker_proc.kill()
