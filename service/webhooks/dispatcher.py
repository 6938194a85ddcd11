"""The dispatcher: sends webhooks' due deliveries, in each API server process.

Its loop claims due deliveries (``deliveries.claim_due``: a lease per delivery, so
several server processes share the work and none sends one twice at once), as many as
it has free slots (``MAX_IN_FLIGHT``), and sends each in a task of its own on the event
loop with one ``httpx.AsyncClient``: a receiver that never answers holds one slot for at
most ``webhook_timeout_s``, never the others, nor the API (nothing of it runs in a
request's path). Then it waits for the poll timer, a wakeup (a ping made here), a free
slot, or the stop.

The database work (claim, record, prune) runs in the thread pool (``anyio.to_thread``),
as the sweep driver's passes do: the store's sessions are synchronous, each call is one
short transaction, and the pool is already sized for the API's own; a thread of its own
would need its own queue and wakeups for nothing more.

An attempt resolves the URL's host, checks every address (``address.pinned``) and
connects to the one it checked, sending the URL's host as Host and, over TLS, as the
server name the certificate is verified against; no redirect is followed, no proxy from
the environment is used, and no connection is kept for a next request (one kept to an
address would carry the next delivery to another name on it). 2xx is delivered; anything
else is retried after ``webhook_retry_base_s`` doubling (at most an hour), up to
``webhook_max_attempts``; a refused address fails the delivery at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio.to_thread
import httpx
from sqlalchemy import Engine

from service.errors import WebhookAddressRefused
from service.settings import Settings
from service.webhooks import address, deliveries, messages
from service.webhooks.deliveries import Attempt, Claimed

log = logging.getLogger(__name__)

MAX_IN_FLIGHT = 16  # deliveries sent at once by one process
CLAIM_MARGIN_S = 30.0  # a claim outlasts its attempt's timeout by this (a slow database)
PRUNE_INTERVAL_S = 60.0  # old deliveries pruned at most this often, once some ended
STOP_GRACE_S = 2.0  # at stop, attempts in flight get this long; the rest are handed back


class _UrlsShownBare(logging.Filter):
    """httpx logs each request's whole URL at INFO: a webhook's may hold a user and
    password, or be a secret itself (a Slack webhook's path). Its records show
    scheme://host:port instead (in the API process, the dispatcher's are httpx's only)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) > 1 and isinstance(args[1], httpx.URL):
            record.args = (args[0], address.shown(str(args[1])), *args[2:])
        return True


_HTTPX_LOG = logging.getLogger("httpx")


class Dispatcher:
    """Sends due deliveries until stopped (``run``), or until none is due (``drain``)."""

    def __init__(
        self, engine: Engine, settings: Settings, *, max_in_flight: int = MAX_IN_FLIGHT
    ) -> None:
        self._engine = engine
        self._settings = settings
        self._max_in_flight = max_in_flight
        self._in_flight: dict[asyncio.Task[None], Claimed] = {}
        self._ended_since_prune = 0
        self._pruned_at = time.monotonic()
        self._claims_failing = False  # the last claim failed (logged once per outage)
        if not any(isinstance(f, _UrlsShownBare) for f in _HTTPX_LOG.filters):
            _HTTPX_LOG.addFilter(_UrlsShownBare())

    async def run(self, stop: asyncio.Event, wakeup: asyncio.Event | None = None) -> None:
        """Claim and send every ``webhook_poll_s`` (at once when woken, or when a slot
        frees while all were busy) until ``stop``."""
        stopped = asyncio.create_task(stop.wait())
        woken = asyncio.create_task(wakeup.wait()) if wakeup is not None else None
        try:
            async with self._client() as client:
                while not stop.is_set():
                    await self._pass(client)
                    waits: set[asyncio.Future[Any]] = {stopped}
                    if woken is not None:
                        waits.add(woken)
                    if len(self._in_flight) >= self._max_in_flight:
                        waits |= set(self._in_flight)
                    await asyncio.wait(
                        waits, timeout=self._settings.webhook_poll_s, return_when="FIRST_COMPLETED"
                    )
                    if woken is not None and wakeup is not None and woken.done():
                        wakeup.clear()
                        woken = asyncio.create_task(wakeup.wait())
                await self._stop()
        finally:
            stopped.cancel()
            if woken is not None:
                woken.cancel()

    async def drain(self) -> None:
        """Send until no delivery is due or in flight (one due later is left): tests'
        and a one-off run's mode."""
        async with self._client() as client:
            while True:
                claimed = await self._pass(client)
                if not self._in_flight:
                    if not claimed:
                        break
                    continue
                await asyncio.wait(set(self._in_flight), return_when="FIRST_COMPLETED")
        await self._prune()

    @contextlib.asynccontextmanager
    async def _client(self) -> AsyncIterator[httpx.AsyncClient]:
        async with httpx.AsyncClient(
            timeout=httpx.Timeout(self._settings.webhook_timeout_s),
            follow_redirects=False,
            trust_env=False,  # an HTTP_PROXY would connect where the guard never looked
            limits=httpx.Limits(max_connections=self._max_in_flight, max_keepalive_connections=0),
        ) as client:
            yield client

    async def _pass(self, client: httpx.AsyncClient) -> int:
        """Claim as many due deliveries as slots are free and start sending them; how many."""
        free = self._max_in_flight - len(self._in_flight)
        if free <= 0:
            return 0
        lease_s = self._settings.webhook_timeout_s + CLAIM_MARGIN_S
        try:
            claims = await anyio.to_thread.run_sync(
                deliveries.claim_due, self._engine, free, lease_s
            )
        except Exception as exc:  # the database may be down for a while: try next time
            if not self._claims_failing:  # once per outage, not once a poll
                log.exception("webhook dispatcher: claiming due deliveries failed")
            else:
                log.debug("webhook dispatcher: claiming still fails: %s", exc)
            self._claims_failing = True
            return 0
        if self._claims_failing:
            log.info("webhook dispatcher: claiming works again")
            self._claims_failing = False
        for claimed in claims:
            task = asyncio.create_task(self._deliver(client, claimed))
            self._in_flight[task] = claimed
            task.add_done_callback(self._done)
        if self._ended_since_prune and time.monotonic() - self._pruned_at >= PRUNE_INTERVAL_S:
            await self._prune()
        return len(claims)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._in_flight.pop(task, None)

    async def _deliver(self, client: httpx.AsyncClient, claimed: Claimed) -> None:
        """One attempt, then its record."""
        attempt = await self._attempt(client, claimed)
        settings = self._settings
        record = functools.partial(
            deliveries.record,
            self._engine,
            claimed,
            attempt,
            retry_base_s=settings.webhook_retry_base_s,
            max_attempts=settings.webhook_max_attempts,
        )
        try:
            state = await anyio.to_thread.run_sync(record)
        except Exception:  # its claim lapses and it is sent again: at least once
            log.exception("webhook delivery %d: recording its attempt failed", claimed.id)
            return
        self._ended_since_prune += 1
        where = f"webhook {claimed.webhook_id} ({address.shown(claimed.url)})"
        number = claimed.attempts + 1
        if attempt.delivered:
            log.info(
                "webhook delivery %d (%s) to %s: delivered, HTTP %s, attempt %d",
                claimed.id, claimed.event, where, attempt.status_code, number,
            )  # fmt: skip
        else:
            log.warning(
                "webhook delivery %d (%s) to %s: attempt %d failed (%s); now %s",
                claimed.id, claimed.event, where, number, attempt.error, state or "not ours",
            )  # fmt: skip

    async def _attempt(self, client: httpx.AsyncClient, claimed: Claimed) -> Attempt:
        """POST the delivery to the address its host resolves to now, once checked."""
        timeout_s = self._settings.webhook_timeout_s
        parts, host, port = address.parts_of(claimed.url)
        content = messages.body(claimed)
        try:
            async with asyncio.timeout(timeout_s):  # the whole attempt, DNS to answer
                ip = await address.pinned(
                    host, port, self._settings.webhook_allow_private_addresses
                )
                headers = messages.headers(claimed, content, int(time.time()))
                headers["Host"] = parts.netloc.rpartition("@")[2]  # as the URL names it
                extensions = {"sni_hostname": host} if parts.scheme == "https" else {}
                url = httpx.URL(claimed.url).copy_with(host=ip)
                request = client.build_request(
                    "POST", url, content=content, headers=headers, extensions=extensions
                )
                # The answer's status is all that counts: its body is never read.
                response = await client.send(request, stream=True)
                await response.aclose()
        except WebhookAddressRefused as refused:
            return Attempt(delivered=False, error=f"not sent: {refused.message}", final=True)
        except TimeoutError:
            return Attempt(delivered=False, error=f"no answer within {timeout_s:g} s")
        except (httpx.HTTPError, httpx.InvalidURL, OSError) as exc:
            return Attempt(delivered=False, error=f"{type(exc).__name__}: {exc}".rstrip(": "))
        except Exception as exc:  # recorded as the attempt's failure, not left to lapse
            log.exception("webhook delivery %d: the attempt failed unexpectedly", claimed.id)
            return Attempt(delivered=False, error=f"{type(exc).__name__}: {exc}".rstrip(": "))
        code = response.status_code
        if 200 <= code < 300:
            return Attempt(delivered=True, status_code=code)
        why = f"HTTP {code}" + (" (a redirect: not followed)" if 300 <= code < 400 else "")
        return Attempt(delivered=False, status_code=code, error=why)

    async def _prune(self) -> None:
        self._ended_since_prune = 0
        self._pruned_at = time.monotonic()
        try:
            await anyio.to_thread.run_sync(deliveries.prune, self._engine)
        except Exception:
            log.exception("webhook dispatcher: pruning old deliveries failed")

    async def _stop(self) -> None:
        """Let attempts in flight end for a moment; hand the rest back unsent."""
        if self._in_flight:
            await asyncio.wait(set(self._in_flight), timeout=STOP_GRACE_S)
        unsent = dict(self._in_flight)
        for task in unsent:
            task.cancel()
        await asyncio.gather(*unsent, return_exceptions=True)
        try:
            await anyio.to_thread.run_sync(deliveries.release, self._engine, list(unsent.values()))
        except Exception:  # their claims lapse instead
            log.exception("webhook dispatcher: handing claims back failed")
