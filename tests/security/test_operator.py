"""Careless neighbours: what reaches the operator's terminal, logs
and an unauthenticated health check.

Threats: a database password printed by ``trainyard migrate`` lands in shell scroll-back,
CI logs and screen shares; ``/healthz``, open to anyone who can reach the port, told them
the database's host, port and user; and a job (anyone with a token runs one) could write
escape sequences into its name, log or reason that the operator's terminal would obey
(retitle it, rewrite what is shown, or worse on old emulators) when the CLI printed them.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.engine import make_url

from service import store
from service.app import create_app
from service.cli.printable import printable
from service.db import make_engine
from service.models import JobStatus
from service.reasons import ReasonCode
from service.settings import Settings
from tests.databases import throwaway_postgres
from tests.stack import REPO, Stack, free_port, running_stack

PASSWORD = "s3cret-pa55word"


def test_migrate_does_not_print_the_database_password(tmp_path: Path) -> None:
    with throwaway_postgres(migrate=False) as url:
        # The test server trusts local connections: the password is sent and ignored.
        with_password = make_url(url).set(password=PASSWORD).render_as_string(hide_password=False)
        r = subprocess.run(
            [sys.executable, "-m", "service.cli", "migrate"],
            env={"PATH": "", "TRAINYARD_DATABASE_URL": with_password, "PYTHONPATH": str(REPO)},
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert r.returncode == 0, r.stderr
    assert "is up to date" in r.stdout and "***" in r.stdout, r.stdout
    assert PASSWORD not in r.stdout + r.stderr


def test_healthz_does_not_tell_strangers_where_the_database_is(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    nobody_listens = f"postgresql+psycopg://trainyard_admin:{PASSWORD}@127.0.0.1:{free_port()}/db"
    settings = Settings(database_url=nobody_listens, data_dir=tmp_path / "data")
    engine = make_engine(settings)
    app = create_app(settings, engine)
    try:
        with caplog.at_level(logging.WARNING), TestClient(app, base_url="http://127.0.0.1") as c:
            r = c.get("/healthz")
    finally:
        engine.dispose()
    assert r.status_code == 503
    assert r.json() == {"status": "error", "database": "unavailable"}
    # the detail is for the operator, in the server's log
    assert "127.0.0.1" in caplog.text and PASSWORD not in caplog.text


def test_cli_does_not_print_a_password_in_the_server_address() -> None:
    url = f"http://operator:{PASSWORD}@127.0.0.1:{free_port()}"  # nothing listens there
    r = subprocess.run(
        [sys.executable, "-m", "service.cli", "ls", "--url", url],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "cannot reach http://operator:***@127.0.0.1" in r.stderr, r.stderr
    assert PASSWORD not in r.stdout + r.stderr


HOSTILE = "\x1b]0;owned\x07\x1b[2J\r\x9b31m"  # retitle, clear the screen, 8-bit CSI
ESCAPED = r"\x1b]0;owned\x07\x1b[2J\r\x9b31m"


def test_printable_escapes_control_characters_but_newline_and_tab() -> None:
    assert printable(f"a{HOSTILE}\tb\nc") == f"a{ESCAPED}\tb\nc"
    assert printable("plain text, ünïcode 🚂") == "plain text, ünïcode 🚂"


def test_cli_shows_a_jobs_escape_sequences_escaped(tmp_path: Path) -> None:
    """A job's log lines and reason, as a runner could write them, through ls, logs and
    status: the terminal gets the escapes as text."""
    with running_stack(tmp_path) as stack:
        job = stack.submit(recipe="tiny", name=f"name{HOSTILE}")  # no worker: it waits
        engine = make_engine(stack.database_url)
        try:
            claim = store.claim_job(
                engine,
                worker_id="w",
                free_devices=1,
                accelerator="cpu",
                recipes=["tiny"],
                lease_s=30.0,
            )
            assert claim is not None and claim.fence.job_id == job["id"]
            line = (time.time(), "stdout", f"[rank 0] step{HOSTILE}")
            assert store.append_logs(engine, claim.fence, [line], max_lines=100)
            failed = store.Outcome(JobStatus.failed, ReasonCode.error, f"boom{HOSTILE}")
            assert store.finish_attempt(engine, claim.fence, failed) is not None
        finally:
            engine.dispose()

        shown = {
            what: cli_output(stack, *args)
            for what, args in {
                "ls": ["ls"],
                "logs": ["logs", str(job["id"])],
                "status": ["status", str(job["id"])],
            }.items()
        }
    assert f"step{ESCAPED}" in shown["logs"] and f"boom{ESCAPED}" in shown["ls"]
    assert "boom" in shown["status"] and "name" in shown["status"]
    for what, out in shown.items():
        assert not any(ch in out for ch in "\x1b\x07\r\x9b"), (what, out)


def cli_output(stack: Stack, *args: str) -> str:
    r = subprocess.run(
        [sys.executable, "-m", "service.cli", *args, "--url", stack.url],
        env=stack.env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    return r.stdout + r.stderr
