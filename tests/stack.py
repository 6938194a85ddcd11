"""A real Trainyard on this machine: `trainyard serve` and workers as processes, for the
end-to-end tests and the benchmarks."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
import uvicorn
from sqlalchemy import create_engine, text

from service.migrate import upgrade

T = TypeVar("T")
REPO = Path(__file__).resolve().parents[1]
RECIPES_DIR = REPO / "tests" / "recipes_dir"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(
    check: Callable[[], T | None], timeout_s: float, what: str, every_s: float = 0.05
) -> T:
    """Poll ``check`` until it returns something truthy; fail with ``what`` at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(every_s)


@contextmanager
def serving(app: Any) -> Iterator[str]:
    """The app on a real uvicorn in a thread (streams and other processes need a real
    connection); its URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started, 10, "uvicorn to start")
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


@dataclass
class Stack:
    url: str
    env: dict[str, str]
    tmp: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    logs: list[Any] = field(default_factory=list)
    http: httpx.Client = field(init=False)

    def __post_init__(self) -> None:
        self.http = httpx.Client(base_url=self.url + "/api/v1", timeout=10)

    def start(
        self, *args: str, log_name: str, env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        log = open(self.tmp / f"{log_name}.log", "ab")  # noqa: SIM115 (closed at teardown)
        self.logs.append(log)
        proc = subprocess.Popen(
            [sys.executable, "-m", "service.cli", *args],
            env={**self.env, **(env or {})},
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.procs.append(proc)
        return proc

    def start_worker(
        self,
        worker_id: str = "e2e",
        env: dict[str, str] | None = None,
        *,
        executor: str = "box",
        **settings: object,
    ) -> subprocess.Popen[bytes]:
        """Start a worker (settings as TRAINYARD_* variables, ``env`` as given) and wait
        until it registered."""
        env = {**(env or {}), **{f"TRAINYARD_{k.upper()}": str(v) for k, v in settings.items()}}
        proc = self.start(
            "worker", "--worker-id", worker_id, "--executor", executor,
            log_name=f"worker-{worker_id}", env=env,
        )  # fmt: skip
        wait_for(
            lambda: any(
                w["id"] == worker_id and w["alive"] and w["pid"] == proc.pid
                for w in self.http.get("/workers").json()
            ),
            60,
            f"worker {worker_id} to register",
        )
        return proc

    @property
    def database_url(self) -> str:
        return self.env["TRAINYARD_DATABASE_URL"]

    def query(self, sql: str, **params: Any) -> list[Any]:
        """Rows from the stack's database, for facts the API does not show."""
        engine = create_engine(self.database_url)
        try:
            with engine.connect() as conn:
                return list(conn.execute(text(sql), params))
        finally:
            engine.dispose()

    def runner_pgid(self, job_id: int) -> int:
        """The process group of the job's runner (recorded just after the claim)."""

        def recorded() -> int | None:
            [(pgid,)] = self.query("SELECT runner_pgid FROM job WHERE id = :id", id=job_id)
            return int(pgid) if pgid is not None else None

        return wait_for(recorded, 10, f"job {job_id}'s runner")

    def job(self, job_id: int) -> dict[str, Any]:
        return self.http.get(f"/jobs/{job_id}").json()  # type: ignore[no-any-return]

    def submit(self, **spec: Any) -> dict[str, Any]:
        r = self.http.post("/jobs", json=spec)
        assert r.status_code == 201, r.text
        return r.json()  # type: ignore[no-any-return]

    def events(
        self, job_id: int, last_event_id: int | None = None, limit: int | None = None
    ) -> list[tuple[int | None, str, Any]]:
        """(id, event, data) of the job's event stream until it ends, or the first ``limit``
        events (then the connection is dropped, as a client that goes away would)."""
        headers = {"Last-Event-ID": str(last_event_id)} if last_event_id is not None else {}
        got: list[tuple[int | None, str, Any]] = []
        timeout = httpx.Timeout(10, read=60)
        with self.http.stream(
            "GET", f"/jobs/{job_id}/events", headers=headers, timeout=timeout
        ) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith(
                "text/event-stream"
            )
            fields: dict[str, str] = {}
            for line in r.iter_lines():
                if line:
                    name, _, value = line.partition(":")
                    fields[name] = value.removeprefix(" ")
                    continue
                if "event" in fields:  # a blank line ends an event (a ping has no event)
                    event_id = int(fields["id"]) if "id" in fields else None
                    got.append((event_id, fields["event"], json.loads(fields["data"])))
                    if fields["event"] == "end" or len(got) == limit:
                        break
                fields = {}
        return got

    def wait_status(
        self, job_id: int, statuses: set[str], timeout_s: float = 120
    ) -> dict[str, Any]:
        return wait_for(
            lambda: (j := self.job(job_id))["status"] in statuses and j,
            timeout_s,
            f"job {job_id} to reach {statuses}",
        )


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def stack_env(tmp: Path, database_url: str, port: int, **settings: object) -> dict[str, str]:
    """The environment of a test stack's processes: its database, data dir and port, the
    test recipes, two CPU slots, no API token; settings as TRAINYARD_* variables."""
    env = {
        **os.environ,
        "TRAINYARD_DATABASE_URL": database_url,
        "TRAINYARD_DATA_DIR": str(tmp / "data"),
        "TRAINYARD_PORT": str(port),
        "TRAINYARD_RECIPES_DIR": str(RECIPES_DIR),
        "TRAINYARD_CPU_SLOTS": "2",
        "PYTHONPATH": str(REPO),
        **{f"TRAINYARD_{k.upper()}": str(v) for k, v in settings.items()},
    }
    env.pop("TRAINYARD_API_TOKEN", None)
    return env


@contextmanager
def running_stack(
    tmp: Path, database_url: str | None = None, **settings: object
) -> Iterator[Stack]:
    """API server on a free port (settings as TRAINYARD_* variables) on a migrated database
    (default: a new SQLite file); workers are started by the caller. All stop on exit."""
    if database_url is None:
        database_url = f"sqlite:///{tmp / 'trainyard.db'}"
        upgrade(database_url)
    port = free_port()
    env = stack_env(tmp, database_url, port, **settings)
    s = Stack(url=f"http://127.0.0.1:{port}", env=env, tmp=tmp)
    s.start("serve", log_name="serve")
    try:
        wait_for(lambda: _healthy(s.url), 30, "the API to answer /healthz")
        yield s
    finally:
        for proc in reversed(s.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)  # a test may have stopped it
                proc.send_signal(signal.SIGTERM)
        for proc in s.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for log in s.logs:
            log.close()
        s.http.close()
