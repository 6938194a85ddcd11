"""docker-compose.yml run for real from the built image, with tests/deploy/compose.cpu.yml.

``python -m tests.deploy.compose_check COMPOSE`` (COMPOSE: a Docker Compose v2 binary;
DOCKER_HOST names the engine, TRAINYARD_PORT and POSTGRES_PORT free loopback ports). Each
scenario logs one line with its result and time; the first failure raises. The stack and
its volumes are removed at the end, whatever happened. scripts/image_check.sh runs this.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import httpx
from safetensors.torch import load

from tests.stack import REPO, wait_for

log = logging.getLogger("compose_check")

PROJECT = "trainyard-check"
IMAGE_UID = "10001"  # the Dockerfile's USER: the API
JOB_UID = "10002"  # trainyard-job: the worker (root) runs each job as it
UP_TIMEOUT_S = 300  # healthchecks: the api's every 10 s, the worker's every 15 s
JOB_TIMEOUT_S = 300.0
# A job that trains for about half a minute on two cores: long enough to be stopped in.
LONG_JOB = {"recipe": "cubic", "accelerator": "cpu", "epochs": 30, "params": {"samples": 65536}}
SHORT_JOB = {"recipe": "cubic", "accelerator": "cpu", "epochs": 3, "params": {"samples": 2048}}


class Compose:
    """The compose project, and the API it serves on the host's loopback."""

    def __init__(self, binary: str, env: dict[str, str]) -> None:
        self.binary = binary
        self.env = env
        port = env.get("TRAINYARD_PORT", "8000")
        self.http = httpx.Client(
            base_url=f"http://127.0.0.1:{port}/api/v1",
            headers={"Authorization": f"Bearer {env['TRAINYARD_API_TOKEN']}"},
            timeout=10,
        )

    def __call__(self, *args: str) -> str:
        """Run ``docker compose`` with the two files; its stdout."""
        files = ["-f", "docker-compose.yml", "-f", "tests/deploy/compose.cpu.yml"]
        result = subprocess.run(
            [self.binary, "-p", PROJECT, *files, *args],
            cwd=REPO,
            env=self.env,
            capture_output=True,
            text=True,
        )
        if result.returncode != 0:
            raise AssertionError(f"compose {' '.join(args)}: {result.stderr.strip()}")
        return result.stdout

    def up(self) -> None:
        """Start every service and wait until each healthcheck says healthy."""
        self("up", "-d", "--wait", "--wait-timeout", str(UP_TIMEOUT_S))
        for service in self.services():
            state = self.state(service)
            assert state["Health"]["Status"] == "healthy", (service, state["Health"])

    def services(self) -> list[str]:
        return self("ps", "--services").split()

    def state(self, service: str) -> dict[str, Any]:
        """The container's State, as docker inspect shows it."""
        container = self("ps", "-a", "-q", service).strip()
        docker = self.env.get("DOCKER", "docker")
        inspect = subprocess.run(
            [docker, "inspect", container], env=self.env, capture_output=True, check=True
        )
        return json.loads(inspect.stdout)[0]["State"]  # type: ignore[no-any-return]

    def uids(self, service: str) -> set[str]:
        """The real uid of every process in the service's container."""
        script = "for f in /proc/[0-9]*/status; do grep '^Uid:' $f; done 2>/dev/null"
        lines = self("exec", "-T", service, "sh", "-c", script).splitlines()
        return {line.split()[1] for line in lines}

    def submit(self, spec: dict[str, Any]) -> int:
        r = self.http.post("/jobs", json=spec)
        assert r.status_code == 201, r.text
        return int(r.json()["id"])

    def job(self, job_id: int) -> dict[str, Any]:
        r = self.http.get(f"/jobs/{job_id}")
        assert r.status_code == 200, r.text
        return r.json()  # type: ignore[no-any-return]

    def wait_job(
        self, job_id: int, check: Callable[[dict[str, Any]], bool], what: str
    ) -> dict[str, Any]:
        """The job, once ``check`` holds for it."""

        def checked() -> dict[str, Any] | None:
            job = self.job(job_id)
            return job if check(job) else None

        return wait_for(checked, JOB_TIMEOUT_S, what, every_s=0.5)

    def finished(self, job_id: int) -> dict[str, Any]:
        done = self.wait_job(job_id, lambda j: j["finished_at"] is not None, f"job {job_id}")
        assert done["status"] == "succeeded", done
        return done

    def logs(self, job_id: int) -> list[str]:
        return [line["text"] for line in self.http.get(f"/jobs/{job_id}/logs").json()]

    def model(self, job_id: int) -> bytes:
        r = self.http.get(f"/jobs/{job_id}/artifacts/model.safetensors")
        assert r.status_code == 200, r.text
        return r.content


def scenario(name: str, run: Callable[[], str]) -> None:
    started = time.monotonic()
    detail = run()
    log.info("%-10s ok (%.0f s): %s", name, time.monotonic() - started, detail)


def check_sqlite(stack: Compose) -> None:
    """api and worker from the image, on SQLite in the named volume."""

    def up() -> str:
        stack.up()
        uids = {service: stack.uids(service) for service in ("api", "worker")}
        assert uids == {"api": {IMAGE_UID}, "worker": {"0"}}, uids
        return f"api and worker healthy: the api's processes uid {IMAGE_UID}, the worker's 0"

    job_id = 0

    def job() -> str:
        nonlocal job_id
        job_id = stack.submit(SHORT_JOB)
        done = stack.finished(job_id)
        weights = load(stack.model(job_id))
        assert weights and done["progress"]["step"] == done["progress"]["total_steps"]
        return f"job {job_id} succeeded; model.safetensors: {len(weights)} tensors"

    def kept() -> tuple[Any, ...]:
        artifacts = stack.http.get(f"/jobs/{job_id}/artifacts").json()
        return stack.job(job_id), stack.logs(job_id), artifacts, stack.model(job_id)

    def restart() -> str:
        before = kept()
        stack("down")  # containers removed; the named volume stays
        stack.up()
        assert kept() == before, "the job, its logs or its artifacts changed across down/up"
        return (
            f"down and up: job {job_id}, its {len(before[1])} log lines and "
            f"{len(before[2])} artifacts (model bytes compared) kept"
        )

    def stop() -> str:
        running = stack.submit(LONG_JOB)
        stack.wait_job(running, lambda j: (j["progress"] or {}).get("epoch", 0) >= 2, "epoch 2")
        assert stack.uids("worker") == {"0", JOB_UID}  # the job's processes as trainyard-job
        stack("stop")
        worker = stack.state("worker")
        assert worker["ExitCode"] == 0 and not worker["OOMKilled"], worker  # not SIGKILLed
        stack("start", "api")  # the API alone: nothing can claim the job meanwhile
        wait_for(lambda: stack.state("api")["Health"]["Status"] == "healthy", 120, "api", 0.5)
        queued = stack.job(running)
        assert queued["status"] == "queued" and queued["attempt"] == 1, queued
        stopped_at = (queued["progress"] or {}).get("epoch")
        stack.up()
        done = stack.finished(running)
        assert done["attempt"] == 1, done  # handed back, no attempt spent
        resumed = [t for t in stack.logs(running) if "resuming from" in t]
        assert resumed, "the job started over instead of resuming from its checkpoint"
        return (
            f"job {running} stopped in epoch {stopped_at}/{LONG_JOB['epochs']}, queued "
            f"({queued['reason']['code']}); after start it resumed and succeeded"
        )

    scenario("up", up)
    scenario("job", job)
    scenario("restart", restart)
    scenario("stop", stop)


def check_postgres(stack: Compose) -> None:
    """The postgres profile: three services, and a job whose rows are in PostgreSQL."""

    def postgres() -> str:
        stack.up()
        assert set(stack.services()) == {"api", "worker", "postgres"}
        job_id = stack.submit(SHORT_JOB)
        stack.finished(job_id)
        load(stack.model(job_id))
        query = f"SELECT status FROM job WHERE id = {job_id}"
        row = stack("exec", "-T", "postgres", "psql", "-U", "trainyard", "-tAc", query)
        assert row.strip() == "succeeded", row
        return f"postgres, api, worker healthy; job {job_id} succeeded, its row in PostgreSQL"

    scenario("postgres", postgres)


def main(binary: str) -> None:
    logging.basicConfig(level=logging.INFO, format="compose_check: %(message)s", stream=sys.stdout)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request
    env = {**os.environ, "TRAINYARD_API_TOKEN": secrets.token_urlsafe(24)}
    env.pop("COMPOSE_PROFILES", None)
    stack = Compose(binary, env)
    try:
        check_sqlite(stack)
        stack("down", "--volumes")
        password = secrets.token_urlsafe(16)
        port = env["POSTGRES_PORT"]
        stack.env |= {
            "COMPOSE_PROFILES": "postgres",
            "POSTGRES_PASSWORD": password,
            "TRAINYARD_DATABASE_URL": (
                f"postgresql+psycopg://trainyard:{password}@127.0.0.1:{port}/trainyard"
            ),
        }
        check_postgres(stack)
    finally:
        stack.env["COMPOSE_PROFILES"] = "postgres"  # so that down removes all three
        try:
            stack("down", "--volumes", "--timeout", "30")
        except AssertionError as error:  # not to hide the failure that brought us here
            log.error("%s", error)


if __name__ == "__main__":
    main(sys.argv[1])
