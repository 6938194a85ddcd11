"""A job or a sweep as the client hands it back: the API's model (its fields are the
answer's) plus what can be done with it, through the client that read it."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import PrivateAttr

from trainyard import models as m

if TYPE_CHECKING:
    from trainyard.aio import AsyncClient
    from trainyard.client import Client


class Job(m.JobRead):
    """A job (``JobRead``'s fields) and what can be done with it."""

    _client: Client = PrivateAttr()

    def _update(self, read: m.JobRead) -> Job:
        self.__dict__.update(read.__dict__)
        return self

    def refresh(self) -> Job:
        """Read the job again; returns it, updated."""
        return self._update(self._client.job(self.id))

    def wait(self, timeout: float | None = None) -> Job:
        """Wait until the job has finished; returns it, updated (``WaitTimeout`` if not
        finished after ``timeout`` seconds)."""
        return self._update(self._client.wait(self.id, timeout))

    def metrics(self, name: str | None = None) -> list[m.MetricRead]:
        return self._client.metrics(self.id, name)

    def logs(self, follow: bool = False) -> Iterator[m.LogLineRead]:
        return self._client.logs(self.id, follow=follow)

    def events(self, after: int | None = None) -> Iterator[m.Event]:
        return self._client.events(self.id, after=after)

    def cancel(self) -> Job:
        return self._update(self._client.cancel(self.id))

    def rerun(self) -> Job:
        """A new job with this one's spec."""
        return self._client.rerun(self.id)

    def artifacts(self) -> list[m.ArtifactRead]:
        return self._client.artifacts(self.id)

    def download(
        self,
        name: str,
        path: str | os.PathLike[str],
        *,
        progress: Callable[[int], None] | None = None,
    ) -> Path:
        return self._client.download(self.id, name, path, progress=progress)


class Sweep(m.SweepRead):
    """A sweep (``SweepRead``'s fields) and what can be done with it."""

    _client: Client = PrivateAttr()

    def refresh(self) -> Sweep:
        self.__dict__.update(self._client.sweep(self.id).__dict__)
        return self

    def cancel(self) -> Sweep:
        self.__dict__.update(self._client.cancel_sweep(self.id).__dict__)
        return self

    def jobs(self, **filters: Any) -> Iterator[Job]:
        """Its trials' jobs."""
        return self._client.jobs(sweep=self.id, **filters)


class AsyncJob(m.JobRead):
    """``Job`` for ``AsyncClient``: the same methods, awaited."""

    _client: AsyncClient = PrivateAttr()

    def _update(self, read: m.JobRead) -> AsyncJob:
        self.__dict__.update(read.__dict__)
        return self

    async def refresh(self) -> AsyncJob:
        return self._update(await self._client.job(self.id))

    async def wait(self, timeout: float | None = None) -> AsyncJob:
        return self._update(await self._client.wait(self.id, timeout))

    async def metrics(self, name: str | None = None) -> list[m.MetricRead]:
        return await self._client.metrics(self.id, name)

    def logs(self, follow: bool = False) -> AsyncIterator[m.LogLineRead]:
        return self._client.logs(self.id, follow=follow)

    def events(self, after: int | None = None) -> AsyncIterator[m.Event]:
        return self._client.events(self.id, after=after)

    async def cancel(self) -> AsyncJob:
        return self._update(await self._client.cancel(self.id))

    async def rerun(self) -> AsyncJob:
        return await self._client.rerun(self.id)

    async def artifacts(self) -> list[m.ArtifactRead]:
        return await self._client.artifacts(self.id)

    async def download(
        self,
        name: str,
        path: str | os.PathLike[str],
        *,
        progress: Callable[[int], None] | None = None,
    ) -> Path:
        return await self._client.download(self.id, name, path, progress=progress)


class AsyncSweep(m.SweepRead):
    """``Sweep`` for ``AsyncClient``."""

    _client: AsyncClient = PrivateAttr()

    async def refresh(self) -> AsyncSweep:
        self.__dict__.update((await self._client.sweep(self.id)).__dict__)
        return self

    async def cancel(self) -> AsyncSweep:
        self.__dict__.update((await self._client.cancel_sweep(self.id)).__dict__)
        return self

    def jobs(self, **filters: Any) -> AsyncIterator[AsyncJob]:
        return self._client.jobs(sweep=self.id, **filters)
