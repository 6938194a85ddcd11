"""``Client``: Trainyard's API from Python, over one HTTP connection pool.

    from trainyard import Client

    client = Client()  # TRAINYARD_URL and TRAINYARD_API_TOKEN, as the CLI reads them
    job = client.submit(recipe="mlp-regression", epochs=3)
    job.wait()
    print(job.status, job.metrics()[-1])

Every answer is a typed model (``trainyard.models``), every error answer an exception
(``trainyard.errors``); a 503 with ``Retry-After`` is waited out and sent again.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO, TypeVar

import httpx

from trainyard import _api as api
from trainyard import config
from trainyard import models as m
from trainyard._sse import EventParser
from trainyard.errors import (
    TrainyardError,
    Unavailable,
    Unreachable,
    WaitTimeout,
    error_of,
    retry_after,
)
from trainyard.handles import Job, Sweep
from trainyard.packing import Packed, digest_of, pack

T = TypeVar("T")
TIMEOUT_S = 30.0
# Transfers and streams wait longer for bytes: a big upload, or an idle job's events
# (the server sends a keep-alive every 15 s, so a minute of silence is a dead link).
TRANSFER_TIMEOUT = httpx.Timeout(30.0, read=600.0, write=600.0)
STREAM_TIMEOUT = httpx.Timeout(30.0, read=60.0)
CHUNK_BYTES = 2**20
FOLLOW_POLL_S = 1.0  # logs(follow=True): how often a running job's new lines are read
WAIT_POLL_S = (0.2, 2.0)  # wait(): first and longest pause between reads of the job


@dataclass(frozen=True)
class Upload:
    digest: str  # sha256:<hex>, what a spec's code or data names
    size: int
    sent: bool  # False: the server had it already, nothing was sent


class Client:
    """A Trainyard server's API. ``url`` and ``token`` default to TRAINYARD_URL and
    TRAINYARD_API_TOKEN (or TRAINYARD_API_TOKEN_FILE); a 503 is retried ``retries`` times."""

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        timeout: float = TIMEOUT_S,
        retries: int = api.RETRIES,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.url = config.server_url(url)
        token = config.api_token(token)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.retries = retries
        self._http = httpx.Client(
            base_url=self.url + "/api/v1", headers=headers, timeout=timeout, transport=transport
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Client({shown(self._http.base_url)!r})"

    # --- jobs ----------------------------------------------------------------------

    def submit(self, spec: Mapping[str, Any] | Any = None, /, **fields: Any) -> Job:
        """Submit a job: a spec (a mapping: recipe, params, strategy, devices, epochs, …)
        and/or those fields as keywords (keywords win)."""
        return self._job(self._send(api.submit(api.job_fields(spec, fields), Job)))

    def submit_code(
        self,
        directory: str | os.PathLike[str],
        entrypoint: Sequence[str] | None = None,
        *,
        recipe: str | None = None,
        data: Mapping[str, str | os.PathLike[str]] | None = None,
        requirements: Sequence[str] | str | os.PathLike[str] | None = None,
        **fields: Any,
    ) -> Job:
        """Submit your own code: ``directory`` is packed (honouring .gitignore and
        .trainyardignore) and uploaded with ``data``'s files, each only if the server lacks
        it; the job runs ``entrypoint`` there, or the package's ``recipe``."""
        body = api.code_fields(entrypoint, recipe, requirements, fields)
        files = api.data_files(data)
        body["code"] = self.upload_code(directory).digest
        if files:
            body["data"] = {
                name: value if isinstance(value, str) else self.upload(value).digest
                for name, value in files.items()
            }
        return self._job(self._send(api.submit(body, Job)))

    def job(self, job_id: int) -> Job:
        """One job."""
        return self._job(self._send(api.job(job_id, Job)))

    def jobs(
        self,
        *,
        status: m.JobStatus | str | None = None,
        owner: str | None = None,
        sweep: int | None = None,
        page_size: int = api.PAGE,
    ) -> Iterator[Job]:
        """Every job (of a status, an owner, "me", a sweep), newest first, page by page."""
        seen: int | None = None
        for offset in itertools.count(0, page_size):
            page = self.jobs_page(
                status=status, owner=owner, sweep=sweep, limit=page_size, offset=offset
            )
            for job in api.newer_than_seen(page.items, seen):
                seen = job.id
                yield job
            if len(page.items) < page_size:
                return

    def jobs_page(
        self,
        *,
        status: m.JobStatus | str | None = None,
        owner: str | None = None,
        sweep: int | None = None,
        limit: int = api.PAGE,
        offset: int = 0,
    ) -> m.Page[Job]:
        """One page of the listing ``jobs`` reads whole, as the API gives it: its
        ``items`` (newest first) and the ``total`` that match."""
        call = api.jobs(
            status=status, owner=owner, sweep=sweep, limit=limit, offset=offset, model=Job
        )
        page = self._send(call)
        for job in page.items:
            self._job(job)
        return page

    def cancel(self, job_id: int) -> Job:
        """Cancel a queued job now, or ask the worker to stop a running one (idempotent)."""
        return self._job(self._send(api.cancel(job_id, Job)))

    def rerun(self, job_id: int) -> Job:
        """A new job with this one's spec."""
        return self._job(self._send(api.rerun(job_id, Job)))

    def wait(self, job_id: int, timeout: float | None = None) -> Job:
        """The job once it has finished (succeeded, failed or cancelled); ``WaitTimeout``
        if it has not after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        pause, longest = WAIT_POLL_S
        while not (job := self._job_before(job_id, deadline, timeout)).status.finished:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise WaitTimeout(f"job {job_id} is still {job.status} after {timeout} s")
            time.sleep(pause if left is None else min(pause, left))
            pause = min(pause * 2, longest)
        return job

    def metrics(
        self, job_id: int, name: str | None = None, *, page_size: int = api.METRICS_PAGE
    ) -> list[m.MetricRead]:
        """Every point of the job's metrics (or of one), ordered by step."""
        found: list[m.MetricRead] = []
        after: int | None = -1
        while after is not None:
            page = self._send(api.metrics(job_id, name=name, after_step=after, limit=page_size))
            kept, after, page_size = api.metrics_page(page, page_size)
            found += kept
        return found

    def logs(self, job_id: int, *, follow: bool = False, after: int = 0) -> Iterator[m.LogLineRead]:
        """The job's log lines after ``after``; with ``follow``, new ones as they come,
        until the job has finished."""
        while True:
            # read before the lines: a job finished by then has no line still to come
            finished = follow and self._send(api.job(job_id, Job)).status.finished
            lines = self._send(api.logs(job_id, after_seq=after, limit=api.LOGS_PAGE))
            yield from lines
            if lines:
                after = lines[-1].seq
            if len(lines) == api.LOGS_PAGE:
                continue
            if not follow or finished:
                return
            time.sleep(FOLLOW_POLL_S)

    def events(self, job_id: int, *, after: int | None = None) -> Iterator[m.Event]:
        """The job's event stream (status, progress, metric, log; ``end`` last), from the
        start or after event ``after``. A dropped connection is opened again and resumed
        after the last event received (``Last-Event-ID``): no event missed, none twice.
        ``Unreachable`` once the server has not served it for ``RECONNECT_FOR_S``."""
        reconnect = api.Reconnect()
        while True:
            headers = {"Last-Event-ID": str(after)} if after is not None else {}
            try:
                with self._http.stream(
                    "GET", api.events_path(job_id), headers=headers, timeout=STREAM_TIMEOUT
                ) as response:
                    if not api.is_stream(response):
                        response.read()
                        time.sleep(reconnect.refused(response))
                        continue
                    parser = EventParser()
                    for line in response.iter_lines():
                        if (event := parser.line(line)) is None:
                            continue
                        reconnect.served()
                        if event.id is not None:
                            after = event.id
                        yield event
                        if event.kind == "end":
                            return
                why: Exception = Unreachable("the stream ended before the job's end")
            except httpx.TransportError as exc:
                why = exc
            time.sleep(reconnect.dropped(f"the event stream of job {job_id}", why))

    def artifacts(self, job_id: int) -> list[m.ArtifactRead]:
        """The job's files: model.safetensors, spec.json, checkpoints, a script's outputs."""
        return self._send(api.artifacts(job_id))

    def download(
        self,
        job_id: int,
        name: str,
        path: str | os.PathLike[str],
        *,
        progress: Callable[[int], None] | None = None,
    ) -> Path:
        """Save artifact ``name`` at ``path`` (a file, or a directory to put it in); the
        file appears whole or not at all."""
        dest = api.download_path(path, name)
        part = dest.with_name(f".{dest.name}.{uuid.uuid4().hex[:8]}.part")
        try:
            with open(part, "wb") as out:
                self.download_to(job_id, name, out, progress=progress)
            os.replace(part, dest)
        finally:
            part.unlink(missing_ok=True)
        return dest

    def download_to(
        self,
        job_id: int,
        name: str,
        out: BinaryIO,
        *,
        progress: Callable[[int], None] | None = None,
    ) -> int:
        """Write artifact ``name``'s bytes to ``out``, an open binary file (stdout's, say),
        as they come; the number written. Where the API redirects to the object store,
        the bytes come from there, asked for without the API's token."""
        where = shown(self._http.base_url)
        try:
            with self._http.stream(
                "GET", api.artifact_path(job_id, name), timeout=TRANSFER_TIMEOUT
            ) as response:
                to_store = api.store_request(response, TRANSFER_TIMEOUT)
                if to_store is None:
                    return self._save(response, name, out, progress)
            where = f"the object store at {to_store.url.host}"  # never its signed query
            # auth=None: nothing of the client's own, should it ever have some
            with contextlib.closing(
                self._http.send(to_store, stream=True, auth=None, follow_redirects=True)
            ) as response:
                return self._save(response, name, out, progress)
        except httpx.TransportError as exc:
            raise Unreachable(f"cannot download {name} from {where}: {exc}") from exc

    @staticmethod
    def _save(
        response: httpx.Response,
        name: str,
        out: BinaryIO,
        progress: Callable[[int], None] | None,
    ) -> int:
        """A download's body written to ``out`` whole, or an exception."""
        if response.is_error:
            response.read()
            raise error_of(response)
        written = 0
        for chunk in response.iter_bytes(CHUNK_BYTES):
            out.write(chunk)
            written += len(chunk)
            if progress is not None:
                progress(len(chunk))
        api.check_length(response, name)
        return written

    # --- sweeps --------------------------------------------------------------------

    def submit_sweep(self, spec: Mapping[str, Any] | Any = None, /, **fields: Any) -> Sweep:
        """Start a sweep: a job spec (``job``), the ``parameters`` to search, ``metric``,
        ``mode``, ``max_trials``, ``search``, ``pruner``…"""
        return self._sweep(self._send(api.submit_sweep(api.job_fields(spec, fields), Sweep)))

    def sweep(self, sweep_id: int) -> Sweep:
        """One sweep, with every trial."""
        return self._sweep(self._send(api.sweep(sweep_id, Sweep)))

    def sweeps(
        self,
        *,
        status: m.SweepStatus | str | None = None,
        owner: str | None = None,
        page_size: int = api.PAGE,
    ) -> Iterator[Sweep]:
        """Every sweep (of a status, an owner or "me"), newest first, without trials."""
        seen: int | None = None
        for offset in itertools.count(0, page_size):
            page = self.sweeps_page(status=status, owner=owner, limit=page_size, offset=offset)
            for sweep in api.newer_than_seen(page.items, seen):
                seen = sweep.id
                yield sweep
            if len(page.items) < page_size:
                return

    def sweeps_page(
        self,
        *,
        status: m.SweepStatus | str | None = None,
        owner: str | None = None,
        limit: int = api.PAGE,
        offset: int = 0,
    ) -> m.Page[Sweep]:
        """One page of the listing ``sweeps`` reads whole, as the API gives it, with its
        ``total``."""
        call = api.sweeps(status=status, owner=owner, limit=limit, offset=offset, model=Sweep)
        page = self._send(call)
        for sweep in page.items:
            self._sweep(sweep)
        return page

    def cancel_sweep(self, sweep_id: int) -> Sweep:
        """End the sweep and cancel its unfinished trials (idempotent)."""
        return self._sweep(self._send(api.cancel_sweep(sweep_id, Sweep)))

    # --- blobs ---------------------------------------------------------------------

    def has_blob(self, digest: str) -> bool:
        """Whether the server stores this blob."""
        response = self._request("HEAD", api.blob_path(digest), ok=(404,))
        return response.status_code == 200

    def upload(
        self, path: str | os.PathLike[str], *, progress: Callable[[int], None] | None = None
    ) -> Upload:
        """Store a file as a blob, unless the server has it already (by its digest)."""
        path = Path(path)
        digest = digest_of(path)
        size = path.stat().st_size
        if self.has_blob(digest):
            return Upload(digest, size, sent=False)

        def chunks() -> Iterator[bytes]:
            with open(path, "rb") as f:
                while chunk := f.read(CHUNK_BYTES):
                    if progress is not None:
                        progress(len(chunk))
                    yield chunk

        headers = {"Content-Type": "application/octet-stream", "Content-Length": str(size)}
        self._request(
            "PUT", api.blob_path(digest), content=chunks(), headers=headers,
            timeout=TRANSFER_TIMEOUT, retry=False,
        )  # fmt: skip
        return Upload(digest, size, sent=True)

    def upload_code(
        self,
        directory: str | os.PathLike[str],
        *,
        progress: Callable[[int], None] | None = None,
        packed: Callable[[Packed], None] | None = None,
    ) -> Upload:
        """Pack ``directory`` into a code package and store it (unless stored already);
        ``packed`` is told what went in before it is sent."""
        with tempfile.TemporaryDirectory(prefix="trainyard-pack-") as tmp:
            package = pack(Path(directory), Path(tmp) / "package.zip")
            if packed is not None:
                packed(package)
            return self.upload(package.path, progress=progress)

    def blobs(self, *, page_size: int = api.PAGE) -> Iterator[m.BlobRead]:
        """Every stored blob, newest first, with the jobs that use it."""
        for offset in itertools.count(0, page_size):
            page = self.blobs_page(limit=page_size, offset=offset)
            yield from page.items
            if len(page.items) < page_size:
                return

    def blobs_page(self, *, limit: int = api.PAGE, offset: int = 0) -> m.BlobList:
        """One page of the listing ``blobs`` reads whole, as the API gives it, with its
        ``total``."""
        return self._send(api.blobs(limit=limit, offset=offset))

    def delete_blob(self, digest: str) -> None:
        """Delete a blob (refused while an unfinished job uses it)."""
        self._send(api.delete_blob(digest))

    # --- the box: recipes, workers, users ------------------------------------------

    def recipes(self) -> list[m.RecipeRead]:
        return self._send(api.recipes())

    def workers(self) -> list[m.WorkerRead]:
        return self._send(api.workers())

    def me(self) -> m.Me:
        """Who the token signs you in as."""
        return self._send(api.me())

    def users(self) -> list[m.UserRead]:
        return self._send(api.users())

    def add_user(self, name: str, *, admin: bool = False) -> m.UserRead:
        return self._send(api.add_user(name, admin))

    def set_quotas(self, name: str, **change: int | None) -> m.UserRead:
        """Change a user's max_running_devices / max_queued_jobs (None: the default)."""
        return self._send(api.set_quotas(name, change))

    def create_token(self, user: str, *, expires_in_days: int | None = None) -> m.TokenCreated:
        return self._send(api.create_token(user, expires_in_days))

    def tokens(self, user: str) -> list[m.TokenRead]:
        return self._send(api.tokens(user))

    def revoke_token(self, token_id: int) -> m.TokenRead:
        return self._send(api.revoke_token(token_id))

    def usage(self) -> list[m.UserUsageRead]:
        return self._send(api.usage())

    def audit(self, *, actor: str | None = None, limit: int = 50, offset: int = 0) -> m.AuditPage:
        return self._send(api.audit(actor=actor, limit=limit, offset=offset))

    # --- webhooks ------------------------------------------------------------------

    def add_webhook(
        self,
        url: str,
        *,
        events: Sequence[str] | None = None,
        secret: str | None = None,
        format: str = "json",
        all_users: bool = False,
    ) -> m.WebhookCreated:
        """Be told at ``url`` when your jobs and sweeps end (``events``: default every
        end; ``format="slack"`` for a Slack incoming webhook). The answer holds the
        signing secret, shown this once."""
        body = api.query(url=url, events=events, secret=secret, format=format)
        return self._send(api.add_webhook({**body, "all_users": all_users}))

    def webhooks(
        self, *, owner: str | None = None, page_size: int = api.PAGE
    ) -> Iterator[m.WebhookRead]:
        """Your webhooks (an admin: everyone's, or ``owner``'s), newest first."""
        for offset in itertools.count(0, page_size):
            page = self._send(api.webhooks(owner=owner, limit=page_size, offset=offset))
            yield from page.items
            if len(page.items) < page_size:
                return

    def webhook(self, webhook_id: int) -> m.WebhookRead:
        """One webhook with its last deliveries and how each went."""
        return self._send(api.webhook(webhook_id))

    def delete_webhook(self, webhook_id: int) -> None:
        self._send(api.delete_webhook(webhook_id))

    def ping_webhook(self, webhook_id: int) -> m.DeliveryRead:
        """Send the webhook a ``webhook.ping`` event now: its delivery, pending."""
        return self._send(api.ping_webhook(webhook_id))

    # --- sending -------------------------------------------------------------------

    def _job(self, job: Job) -> Job:
        job._client = self  # what its methods go through
        return job

    def _sweep(self, sweep: Sweep) -> Sweep:
        sweep._client = self
        return sweep

    def _job_before(self, job_id: int, deadline: float | None, timeout: float | None) -> Job:
        """The job, read for ``wait``: ``WaitTimeout`` rather than a read (or its retries)
        that would end past the deadline."""
        try:
            return self._job(self._send(api.job(job_id, Job), deadline=deadline))
        except (Unreachable, Unavailable) as exc:
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(f"job {job_id} not read before {timeout} s: {exc}") from exc
            raise

    def _send(self, call: api.Call[T], deadline: float | None = None) -> T:
        response = self._request(
            call.method, call.path, params=call.params, json=call.json, headers=call.headers,
            retry=call.retry, deadline=deadline,
        )  # fmt: skip
        return call.read(response.content)

    def _request(
        self,
        method: str,
        path: str,
        *,
        retry: bool = True,
        ok: tuple[int, ...] = (),
        deadline: float | None = None,
        **kw: Any,
    ) -> httpx.Response:
        """The answer; an ``ApiError`` for an error one (``ok``: codes that are answers)."""
        for attempt in itertools.count():
            if deadline is not None:  # no longer than what is left (wait's timeout)
                kw["timeout"] = max(deadline - time.monotonic(), 0.001)
            try:
                response = self._http.request(method, path, **kw)
            except httpx.TransportError as exc:
                raise Unreachable(f"cannot reach {shown(self._http.base_url)}: {exc}") from exc
            if not response.is_error or response.status_code in ok:
                return response
            wait = api.retry_wait(
                response.status_code, retry_after(response), attempt, retry, self.retries
            )
            if wait is None or (deadline is not None and time.monotonic() + wait > deadline):
                raise error_of(response)
            time.sleep(wait)
        raise AssertionError("unreachable")  # pragma: no cover (count() never ends)


def shown(url: httpx.URL) -> str:
    """A server's address as it may be printed: a password in it as ``***``."""
    return str(url.copy_with(username=url.username, password="***") if url.password else url)


__all__ = ["Client", "Job", "Sweep", "TrainyardError", "Upload"]
