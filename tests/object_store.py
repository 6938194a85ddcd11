"""A real S3-compatible server on loopback for the object-storage tests: one moto process
per test run, and per test a fresh bucket behind a relay that can be stopped (the store is
down: connections refused) and started again (the same objects are there)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import httpx

from service.objects.store import ObjectStore
from tests.relay import Cutter

START_TIMEOUT_S = 30.0  # moto imports a lot before it listens
REGION = "us-east-1"
# Any non-empty values: moto accepts every key, but boto3 signs nothing without one.
ACCESS_KEY_ID = "trainyard-test-key"
SECRET_ACCESS_KEY = "trainyard-test-secret"
# Variables that would steer boto3 elsewhere than the test server.
OTHER_AWS_VARS = ("AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN")


def moto_server_binary() -> Path:
    """The ``moto_server`` script beside this Python; fails, saying how to get it, if absent
    (moto is a dev dependency: the object-storage tests run everywhere, never skipped)."""
    binary = Path(sys.executable).parent / "moto_server"
    if not binary.exists():
        raise RuntimeError(
            f"{binary} is missing: the object-storage tests need moto[server], a dev "
            "dependency (make install)"
        )
    return binary


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class MotoProcess:
    """``moto_server`` on a free loopback port, everything it holds in its memory."""

    def __init__(self, log_path: Path) -> None:
        self.port = _free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.admin: Any = None
        self._log = log_path.open("wb")
        self.process = subprocess.Popen(
            [str(moto_server_binary()), "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own group: stopped whole, never by a stray signal
        )
        try:
            self._wait_until_it_answers()
            # Straight to moto, no relay: buckets made and dropped with it. One for the
            # run: a boto3 client takes half a second to make.
            self.admin = self._admin_client()
        except BaseException:
            self.stop()
            raise

    def _wait_until_it_answers(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"moto_server exited ({self.process.returncode}) before it answered: "
                    f"{self.log_path.read_text(errors='replace')[-2000:]}"
                )
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.endpoint}/moto-api/", timeout=1.0).status_code < 500:
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(f"moto_server did not answer within {START_TIMEOUT_S}s")
            time.sleep(0.1)

    def _admin_client(self) -> Any:
        return boto3.session.Session().client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=REGION,
            aws_access_key_id=ACCESS_KEY_ID,
            aws_secret_access_key=SECRET_ACCESS_KEY,
        )

    def stop(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        if self.admin is not None:
            self.admin.close()
        self._log.close()


class S3Server:
    """One test's bucket and prefix on the moto process, reached through a relay.

    ``url`` is the storage URL (``s3://bucket/prefix``), ``endpoint`` the relay's address,
    ``env`` the variables that point boto3 at it (pass them to the processes a test starts).
    ``stop()`` makes the store unreachable (live connections cut, new ones refused) and
    ``start()`` reachable again, with every object still there.
    """

    def __init__(self, moto: MotoProcess) -> None:
        self.moto = moto
        self.bucket = f"trainyard-test-{uuid.uuid4().hex[:12]}"
        self.url = f"s3://{self.bucket}/run-{uuid.uuid4().hex[:8]}/"
        self.relay = Cutter(moto.port)
        self.endpoint = f"http://127.0.0.1:{self.relay.port}"
        self.env = {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY_ID,
            "AWS_SECRET_ACCESS_KEY": SECRET_ACCESS_KEY,
            "AWS_DEFAULT_REGION": REGION,
        }
        self._stores: list[ObjectStore] = []
        self._admin = moto.admin
        self._admin.create_bucket(Bucket=self.bucket)

    def __repr__(self) -> str:
        return f"S3Server({self.url} at {self.endpoint})"

    def store(self, url: str | None = None, **kw: Any) -> ObjectStore:
        """An ObjectStore for ``url`` (this server's by default), made with ``env`` in
        force whatever ``os.environ`` holds: boto3 reads its endpoint and credentials as
        the client is made."""
        with _environment(self.env):
            store = ObjectStore(url or self.url, **kw)
        self._stores.append(store)
        return store

    def stop(self) -> None:
        self.relay.stop()

    def start(self) -> None:
        self.relay.start()

    def close(self) -> None:
        """Stop the relay, close the stores' connections, drop the bucket and its objects."""
        self.relay.close()
        for store in self._stores:
            store.client.close()
        with contextlib.suppress(Exception):  # a test may have dropped it itself
            pages = self._admin.get_paginator("list_objects_v2").paginate(Bucket=self.bucket)
            for page in pages:
                keys = [{"Key": item["Key"]} for item in page.get("Contents", [])]
                if keys:
                    self._admin.delete_objects(Bucket=self.bucket, Delete={"Objects": keys})
            self._admin.delete_bucket(Bucket=self.bucket)


@contextlib.contextmanager
def _environment(env: dict[str, str]) -> Iterator[None]:
    """``env`` set, and the variables that would steer boto3 elsewhere unset, meanwhile."""
    names = [*env, *OTHER_AWS_VARS]
    before = {name: os.environ.get(name) for name in names}
    for name in OTHER_AWS_VARS:
        os.environ.pop(name, None)
    os.environ.update(env)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextlib.contextmanager
def moto_process(log_dir: Path) -> Iterator[MotoProcess]:
    """A moto process for as long as the block runs."""
    moto = MotoProcess(log_dir / "moto_server.log")
    try:
        yield moto
    finally:
        moto.stop()


@contextlib.contextmanager
def s3_server(moto: MotoProcess) -> Iterator[S3Server]:
    """A fresh bucket and prefix behind its own relay, for as long as the block runs."""
    server = S3Server(moto)
    try:
        yield server
    finally:
        server.close()
