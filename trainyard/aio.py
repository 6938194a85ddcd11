"""``AsyncClient``: ``Client``'s methods for asyncio, awaited; listings and streams are
async iterators.

    async with AsyncClient() as client:
        job = await client.submit(recipe="mlp-regression")
        async for event in job.events():
            print(event.kind, event.data)
"""

from __future__ import annotations

import asyncio
import itertools
import os
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO, TypeVar

import httpx

from trainyard import _api as api
from trainyard import config
from trainyard import models as m
from trainyard._sse import EventParser
from trainyard.client import (
    CHUNK_BYTES,
    FOLLOW_POLL_S,
    STREAM_TIMEOUT,
    TIMEOUT_S,
    TRANSFER_TIMEOUT,
    WAIT_POLL_S,
    Upload,
    shown,
)
from trainyard.errors import Unavailable, Unreachable, WaitTimeout, error_of, retry_after
from trainyard.handles import AsyncJob, AsyncSweep
from trainyard.packing import Packed, digest_of, pack

T = TypeVar("T")


class AsyncClient:
    """``Client`` for asyncio: the same arguments and methods, awaited."""

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        timeout: float = TIMEOUT_S,
        retries: int = api.RETRIES,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.url = config.server_url(url)
        token = config.api_token(token)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.retries = retries
        self._http = httpx.AsyncClient(
            base_url=self.url + "/api/v1", headers=headers, timeout=timeout, transport=transport
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"AsyncClient({shown(self._http.base_url)!r})"

    # --- jobs ----------------------------------------------------------------------

    async def submit(self, spec: Mapping[str, Any] | Any = None, /, **fields: Any) -> AsyncJob:
        """``Client.submit``."""
        return self._job(await self._send(api.submit(api.job_fields(spec, fields), AsyncJob)))

    async def submit_code(
        self,
        directory: str | os.PathLike[str],
        entrypoint: Sequence[str] | None = None,
        *,
        recipe: str | None = None,
        data: Mapping[str, str | os.PathLike[str]] | None = None,
        requirements: Sequence[str] | str | os.PathLike[str] | None = None,
        **fields: Any,
    ) -> AsyncJob:
        """``Client.submit_code``."""
        body = api.code_fields(entrypoint, recipe, requirements, fields)
        files = api.data_files(data)
        body["code"] = (await self.upload_code(directory)).digest
        if files:
            body["data"] = {
                name: value if isinstance(value, str) else (await self.upload(value)).digest
                for name, value in files.items()
            }
        return self._job(await self._send(api.submit(body, AsyncJob)))

    async def job(self, job_id: int) -> AsyncJob:
        return self._job(await self._send(api.job(job_id, AsyncJob)))

    async def jobs(
        self,
        *,
        status: m.JobStatus | str | None = None,
        owner: str | None = None,
        sweep: int | None = None,
        page_size: int = api.PAGE,
    ) -> AsyncIterator[AsyncJob]:
        """``Client.jobs``."""
        seen: int | None = None
        for offset in itertools.count(0, page_size):
            page = await self.jobs_page(
                status=status, owner=owner, sweep=sweep, limit=page_size, offset=offset
            )
            for job in api.newer_than_seen(page.items, seen):
                seen = job.id
                yield job
            if len(page.items) < page_size:
                return

    async def jobs_page(
        self,
        *,
        status: m.JobStatus | str | None = None,
        owner: str | None = None,
        sweep: int | None = None,
        limit: int = api.PAGE,
        offset: int = 0,
    ) -> m.Page[AsyncJob]:
        """``Client.jobs_page``."""
        call = api.jobs(
            status=status, owner=owner, sweep=sweep, limit=limit, offset=offset, model=AsyncJob
        )
        page = await self._send(call)
        for job in page.items:
            self._job(job)
        return page

    async def cancel(self, job_id: int) -> AsyncJob:
        return self._job(await self._send(api.cancel(job_id, AsyncJob)))

    async def rerun(self, job_id: int) -> AsyncJob:
        return self._job(await self._send(api.rerun(job_id, AsyncJob)))

    async def wait(self, job_id: int, timeout: float | None = None) -> AsyncJob:
        """``Client.wait``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        pause, longest = WAIT_POLL_S
        while not (job := await self._job_before(job_id, deadline, timeout)).status.finished:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise WaitTimeout(f"job {job_id} is still {job.status} after {timeout} s")
            await asyncio.sleep(pause if left is None else min(pause, left))
            pause = min(pause * 2, longest)
        return job

    async def metrics(
        self, job_id: int, name: str | None = None, *, page_size: int = api.METRICS_PAGE
    ) -> list[m.MetricRead]:
        found: list[m.MetricRead] = []
        after: int | None = -1
        while after is not None:
            call = api.metrics(job_id, name=name, after_step=after, limit=page_size)
            page = await self._send(call)
            kept, after, page_size = api.metrics_page(page, page_size)
            found += kept
        return found

    async def logs(
        self, job_id: int, *, follow: bool = False, after: int = 0
    ) -> AsyncIterator[m.LogLineRead]:
        """``Client.logs``."""
        while True:
            finished = follow and (await self._send(api.job(job_id, AsyncJob))).status.finished
            lines = await self._send(api.logs(job_id, after_seq=after, limit=api.LOGS_PAGE))
            for line in lines:
                yield line
            if lines:
                after = lines[-1].seq
            if len(lines) == api.LOGS_PAGE:
                continue
            if not follow or finished:
                return
            await asyncio.sleep(FOLLOW_POLL_S)

    async def events(self, job_id: int, *, after: int | None = None) -> AsyncIterator[m.Event]:
        """``Client.events``: resumed after the last event received when dropped."""
        reconnect = api.Reconnect()
        while True:
            headers = {"Last-Event-ID": str(after)} if after is not None else {}
            try:
                async with self._http.stream(
                    "GET", api.events_path(job_id), headers=headers, timeout=STREAM_TIMEOUT
                ) as response:
                    if not api.is_stream(response):
                        await response.aread()
                        await asyncio.sleep(reconnect.refused(response))
                        continue
                    parser = EventParser()
                    async for line in response.aiter_lines():
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
            await asyncio.sleep(reconnect.dropped(f"the event stream of job {job_id}", why))

    async def artifacts(self, job_id: int) -> list[m.ArtifactRead]:
        return await self._send(api.artifacts(job_id))

    async def download(
        self,
        job_id: int,
        name: str,
        path: str | os.PathLike[str],
        *,
        progress: Callable[[int], None] | None = None,
    ) -> Path:
        """``Client.download``."""
        dest = api.download_path(path, name)
        part = dest.with_name(f".{dest.name}.{uuid.uuid4().hex[:8]}.part")
        try:
            with open(part, "wb") as out:
                await self.download_to(job_id, name, out, progress=progress)
            os.replace(part, dest)
        finally:
            part.unlink(missing_ok=True)
        return dest

    async def download_to(
        self,
        job_id: int,
        name: str,
        out: BinaryIO,
        *,
        progress: Callable[[int], None] | None = None,
    ) -> int:
        """``Client.download_to``."""
        where = shown(self._http.base_url)
        try:
            async with self._http.stream(
                "GET", api.artifact_path(job_id, name), timeout=TRANSFER_TIMEOUT
            ) as response:
                to_store = api.store_request(response, TRANSFER_TIMEOUT)
                if to_store is None:
                    return await self._save(response, name, out, progress)
            where = f"the object store at {to_store.url.host}"  # never its signed query
            response = await self._http.send(
                to_store, stream=True, auth=None, follow_redirects=True
            )
            try:
                return await self._save(response, name, out, progress)
            finally:
                await response.aclose()
        except httpx.TransportError as exc:
            raise Unreachable(f"cannot download {name} from {where}: {exc}") from exc

    @staticmethod
    async def _save(
        response: httpx.Response,
        name: str,
        out: BinaryIO,
        progress: Callable[[int], None] | None,
    ) -> int:
        """``Client._save``."""
        if response.is_error:
            await response.aread()
            raise error_of(response)
        written = 0
        async for chunk in response.aiter_bytes(CHUNK_BYTES):
            out.write(chunk)
            written += len(chunk)
            if progress is not None:
                progress(len(chunk))
        api.check_length(response, name)
        return written

    # --- sweeps --------------------------------------------------------------------

    async def submit_sweep(
        self, spec: Mapping[str, Any] | Any = None, /, **fields: Any
    ) -> AsyncSweep:
        call = api.submit_sweep(api.job_fields(spec, fields), AsyncSweep)
        return self._sweep(await self._send(call))

    async def sweep(self, sweep_id: int) -> AsyncSweep:
        return self._sweep(await self._send(api.sweep(sweep_id, AsyncSweep)))

    async def sweeps(
        self,
        *,
        status: m.SweepStatus | str | None = None,
        owner: str | None = None,
        page_size: int = api.PAGE,
    ) -> AsyncIterator[AsyncSweep]:
        seen: int | None = None
        for offset in itertools.count(0, page_size):
            page = await self.sweeps_page(
                status=status, owner=owner, limit=page_size, offset=offset
            )
            for sweep in api.newer_than_seen(page.items, seen):
                seen = sweep.id
                yield sweep
            if len(page.items) < page_size:
                return

    async def sweeps_page(
        self,
        *,
        status: m.SweepStatus | str | None = None,
        owner: str | None = None,
        limit: int = api.PAGE,
        offset: int = 0,
    ) -> m.Page[AsyncSweep]:
        """``Client.sweeps_page``."""
        call = api.sweeps(status=status, owner=owner, limit=limit, offset=offset, model=AsyncSweep)
        page = await self._send(call)
        for sweep in page.items:
            self._sweep(sweep)
        return page

    async def cancel_sweep(self, sweep_id: int) -> AsyncSweep:
        return self._sweep(await self._send(api.cancel_sweep(sweep_id, AsyncSweep)))

    # --- blobs ---------------------------------------------------------------------

    async def has_blob(self, digest: str) -> bool:
        response = await self._request("HEAD", api.blob_path(digest), ok=(404,))
        return response.status_code == 200

    async def upload(
        self, path: str | os.PathLike[str], *, progress: Callable[[int], None] | None = None
    ) -> Upload:
        """``Client.upload`` (the file is hashed in a thread)."""
        path = Path(path)
        digest = await asyncio.to_thread(digest_of, path)
        size = path.stat().st_size
        if await self.has_blob(digest):
            return Upload(digest, size, sent=False)

        async def chunks() -> AsyncIterator[bytes]:
            with open(path, "rb") as f:
                while chunk := f.read(CHUNK_BYTES):
                    if progress is not None:
                        progress(len(chunk))
                    yield chunk

        headers = {"Content-Type": "application/octet-stream", "Content-Length": str(size)}
        await self._request(
            "PUT", api.blob_path(digest), content=chunks(), headers=headers,
            timeout=TRANSFER_TIMEOUT, retry=False,
        )  # fmt: skip
        return Upload(digest, size, sent=True)

    async def upload_code(
        self,
        directory: str | os.PathLike[str],
        *,
        progress: Callable[[int], None] | None = None,
        packed: Callable[[Packed], None] | None = None,
    ) -> Upload:
        """``Client.upload_code`` (packed in a thread)."""
        with tempfile.TemporaryDirectory(prefix="trainyard-pack-") as tmp:
            package = await asyncio.to_thread(pack, Path(directory), Path(tmp) / "package.zip")
            if packed is not None:
                packed(package)
            return await self.upload(package.path, progress=progress)

    async def blobs(self, *, page_size: int = api.PAGE) -> AsyncIterator[m.BlobRead]:
        for offset in itertools.count(0, page_size):
            page = await self.blobs_page(limit=page_size, offset=offset)
            for blob in page.items:
                yield blob
            if len(page.items) < page_size:
                return

    async def blobs_page(self, *, limit: int = api.PAGE, offset: int = 0) -> m.BlobList:
        """``Client.blobs_page``."""
        return await self._send(api.blobs(limit=limit, offset=offset))

    async def delete_blob(self, digest: str) -> None:
        await self._send(api.delete_blob(digest))

    # --- the box: recipes, workers, users ------------------------------------------

    async def recipes(self) -> list[m.RecipeRead]:
        return await self._send(api.recipes())

    async def workers(self) -> list[m.WorkerRead]:
        return await self._send(api.workers())

    async def me(self) -> m.Me:
        return await self._send(api.me())

    async def users(self) -> list[m.UserRead]:
        return await self._send(api.users())

    async def add_user(self, name: str, *, admin: bool = False) -> m.UserRead:
        return await self._send(api.add_user(name, admin))

    async def set_quotas(self, name: str, **change: int | None) -> m.UserRead:
        return await self._send(api.set_quotas(name, change))

    async def create_token(
        self, user: str, *, expires_in_days: int | None = None
    ) -> m.TokenCreated:
        return await self._send(api.create_token(user, expires_in_days))

    async def tokens(self, user: str) -> list[m.TokenRead]:
        return await self._send(api.tokens(user))

    async def revoke_token(self, token_id: int) -> m.TokenRead:
        return await self._send(api.revoke_token(token_id))

    async def usage(self) -> list[m.UserUsageRead]:
        return await self._send(api.usage())

    async def audit(
        self, *, actor: str | None = None, limit: int = 50, offset: int = 0
    ) -> m.AuditPage:
        return await self._send(api.audit(actor=actor, limit=limit, offset=offset))

    # --- webhooks ------------------------------------------------------------------

    async def add_webhook(
        self,
        url: str,
        *,
        events: Sequence[str] | None = None,
        secret: str | None = None,
        format: str = "json",
        all_users: bool = False,
    ) -> m.WebhookCreated:
        """``Client.add_webhook``."""
        body = api.query(url=url, events=events, secret=secret, format=format)
        return await self._send(api.add_webhook({**body, "all_users": all_users}))

    async def webhooks(
        self, *, owner: str | None = None, page_size: int = api.PAGE
    ) -> AsyncIterator[m.WebhookRead]:
        for offset in itertools.count(0, page_size):
            page = await self._send(api.webhooks(owner=owner, limit=page_size, offset=offset))
            for webhook in page.items:
                yield webhook
            if len(page.items) < page_size:
                return

    async def webhook(self, webhook_id: int) -> m.WebhookRead:
        return await self._send(api.webhook(webhook_id))

    async def delete_webhook(self, webhook_id: int) -> None:
        await self._send(api.delete_webhook(webhook_id))

    async def ping_webhook(self, webhook_id: int) -> m.DeliveryRead:
        return await self._send(api.ping_webhook(webhook_id))

    # --- sending -------------------------------------------------------------------

    def _job(self, job: AsyncJob) -> AsyncJob:
        job._client = self  # what its methods go through
        return job

    def _sweep(self, sweep: AsyncSweep) -> AsyncSweep:
        sweep._client = self
        return sweep

    async def _job_before(
        self, job_id: int, deadline: float | None, timeout: float | None
    ) -> AsyncJob:
        """The job, read for ``wait``: ``WaitTimeout`` rather than a read (or its retries)
        that would end past the deadline."""
        try:
            return self._job(await self._send(api.job(job_id, AsyncJob), deadline=deadline))
        except (Unreachable, Unavailable) as exc:
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(f"job {job_id} not read before {timeout} s: {exc}") from exc
            raise

    async def _send(self, call: api.Call[T], deadline: float | None = None) -> T:
        response = await self._request(
            call.method, call.path, params=call.params, json=call.json, headers=call.headers,
            retry=call.retry, deadline=deadline,
        )  # fmt: skip
        return call.read(response.content)

    async def _request(
        self,
        method: str,
        path: str,
        *,
        retry: bool = True,
        ok: tuple[int, ...] = (),
        deadline: float | None = None,
        **kw: Any,
    ) -> httpx.Response:
        for attempt in itertools.count():
            if deadline is not None:  # no longer than what is left (wait's timeout)
                kw["timeout"] = max(deadline - time.monotonic(), 0.001)
            try:
                response = await self._http.request(method, path, **kw)
            except httpx.TransportError as exc:
                raise Unreachable(f"cannot reach {shown(self._http.base_url)}: {exc}") from exc
            if not response.is_error or response.status_code in ok:
                return response
            wait = api.retry_wait(
                response.status_code, retry_after(response), attempt, retry, self.retries
            )
            if wait is None or (deadline is not None and time.monotonic() + wait > deadline):
                raise error_of(response)
            await asyncio.sleep(wait)
        raise AssertionError("unreachable")  # pragma: no cover (count() never ends)
