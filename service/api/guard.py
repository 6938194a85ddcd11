"""What every request passes before a route sees it: the Host it was sent to, where a
write comes from, the token, and the size of its body; and the headers every answer
carries so a browser does not run, sniff or frame what it is given.

One ASGI middleware, so a refused request costs no body read, no database, no thread
hop. The order is the threat's: a page in the user's browser (DNS rebinding, a cross-site
form) is refused before the token is looked at, and the token before any byte of the
body is read (FastAPI reads a JSON body before a route's dependencies run).
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from sqlalchemy import Engine
from starlette.exceptions import HTTPException
from starlette.types import Message, Receive, Scope, Send

from service.settings import Settings
from service.users import IDENTITIES, Identity, Lookup, resolve

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# A browser's own navigation ("none": typed, bookmarked) or the page's own origin. Not
# "same-site": another port on localhost is the same site.
TRUSTED_FETCH_SITES = frozenset({"same-origin", "none"})
# After a 413 the rest of the body is not wanted: the server closes the connection
# rather than reading and dropping it for as long as the client sends.
CLOSE = {"Connection": "close"}
MISSING_TOKEN = (
    "missing, wrong, revoked or expired token: send Authorization: Bearer <your token> "
    "(a user's, from `trainyard tokens create`, or TRAINYARD_API_TOKEN)"
)

# Scripts only from this origin (the dashboard and Swagger UI are served from it; a
# route may send a stricter or hash-extended policy of its own); inline styles are
# allowed (charts set them; they run no code); never framed (clickjacking).
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; object-src 'none'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'"
)
SECURITY_HEADERS = (
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
)


def inline_script_hashes(page: bytes) -> str:
    """The default policy, its ``script-src`` extended by the hash of each inline script
    in ``page`` (a page of our own making that must run one, like Swagger UI's)."""
    scripts = re.findall(rb"<script>(.*?)</script>", page, re.DOTALL)
    hashes = " ".join(
        f"'sha256-{base64.b64encode(hashlib.sha256(s).digest()).decode()}'" for s in scripts
    )
    return CONTENT_SECURITY_POLICY.replace("script-src 'self'", f"script-src 'self' {hashes}")


def host_name(host_header: str) -> str:
    """The name in a Host header, without its port: ``[::1]:8000`` → ``::1``."""
    host = host_header.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


# Always answered to: a page that rebinds its own name to this box sends that name, never
# one of these; and the container's healthcheck, a load balancer or Prometheus on the box
# may ask by them whatever ALLOWED_HOSTS names.
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})


def host_allowed(name: str, allowed: list[str]) -> bool:
    """``name`` is a loopback name or matches an entry: the name itself, ``*.suffix``, or
    ``*`` (any)."""
    return name in LOOPBACK_NAMES or any(
        entry == "*" or entry == name or (entry.startswith("*.") and name.endswith(entry[1:]))
        for entry in allowed
    )


def cross_site(method: str, headers: Mapping[str, str]) -> str | None:
    """Why a write comes from another site's page, or None. Browsers send these headers on
    every cross-origin request, and a page cannot forge them; clients that are not
    browsers (the CLI, curl, Prometheus) send neither and pass."""
    if method in SAFE_METHODS:
        return None
    site = headers.get("sec-fetch-site")
    if site is not None:
        # The browser's own verdict, which a page cannot forge. It holds behind a proxy
        # that rewrites Host, where comparing Origin with Host would refuse the dashboard.
        return None if site in TRUSTED_FETCH_SITES else f"Sec-Fetch-Site: {site}"
    # A browser from before Fetch Metadata (2020-2023): its Origin against our Host.
    origin = headers.get("origin")
    if origin is not None and urlsplit(origin).netloc.lower() != headers.get("host", "").lower():
        return f"Origin: {origin}"
    return None


class RequestGuard:
    """ASGI middleware: Host, cross-site writes, the token on guarded paths, the body limit
    (counted as bytes arrive, chunked or not), and the security headers."""

    def __init__(
        self,
        app: Any,
        settings: Settings,
        engine: Engine,
        guarded: Callable[[str], bool],
        streamed: Callable[[str, str], bool],
    ) -> None:
        """``guarded(path)``: needs a token. ``streamed(method, path)``: reads its body
        under limits of its own (blob uploads), not ``max_body_bytes``. ``engine``: where
        users' tokens are looked up. Refuses settings whose Host check a rebinding page
        passes with no token behind it (a wildcard in ALLOWED_HOSTS)."""
        unsafe = settings.unsafe_hosts()  # however the app is served, not only by the CLI
        if unsafe is not None:
            raise ValueError(unsafe)
        self.app = app
        self.settings = settings
        self.engine = engine
        self.guarded = guarded
        self.streamed = streamed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        send = _with_security_headers(send)
        headers = _headers(scope)
        refusal = self._refusal(scope, headers)
        if refusal is None and self.guarded(scope["path"]):
            identity = await self._identity(headers.get("authorization"))
            if identity is None:
                refusal = _error(401, MISSING_TOKEN, {"WWW-Authenticate": "Bearer"})
            else:  # request.state.identity: who the routes act for
                scope.setdefault("state", {})["identity"] = identity
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        if self.streamed(scope["method"], scope["path"]):
            await self.app(scope, receive, send)
            return
        limit = self.settings.max_body_bytes
        declared = headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            await _body_too_large(limit)(scope, receive, send)
            return
        await _limited(self.app, limit, scope, receive, send)

    def _refusal(self, scope: Scope, headers: Mapping[str, str]) -> JSONResponse | None:
        name = host_name(headers.get("host", ""))
        if not host_allowed(name, self.settings.allowed_hosts):
            return _error(
                400,
                f"this server does not answer to the host {name!r}: "
                "add it to TRAINYARD_ALLOWED_HOSTS if it is this server's name",
            )
        why = cross_site(scope["method"], headers)
        if why is not None:
            return _error(403, f"refused a write from another site's page ({why})")
        return None

    async def _identity(self, authorization: str | None) -> Identity | None:
        """Who the request is, before any byte of its body is read (a user's token not
        seen a moment ago is looked up in the pool: a query)."""
        found = resolve(self.settings, authorization)
        if isinstance(found, Lookup):
            return await run_in_threadpool(IDENTITIES.get, self.engine, found.token)
        return found


async def _limited(app: Any, limit: int, scope: Scope, receive: Receive, send: Send) -> None:
    """Run ``app`` with a ``receive`` that counts body bytes and stops past ``limit``.

    The stop is an HTTPException: FastAPI passes those through its body parsing (any
    other error there becomes a 400), so the app's own handler answers it as JSON."""
    received = 0
    started = False

    async def counting() -> Message:
        nonlocal received
        message = await receive()
        if message["type"] == "http.request":
            received += len(message.get("body", b""))
            if received > limit:
                raise HTTPException(413, _too_large(limit), headers=CLOSE)
        return message

    async def noting(message: Message) -> None:
        nonlocal started
        started = started or message["type"] == "http.response.start"
        await send(message)

    try:
        await app(scope, counting, noting)
    except HTTPException as error:  # raised where no handler of the app's caught it
        if error.status_code != 413 or started:
            raise
        await _body_too_large(limit)(scope, receive, send)


# The headers the guard reads; ASGI servers hand header names over lowercased.
_READ = frozenset({b"host", b"origin", b"sec-fetch-site", b"authorization", b"content-length"})


def _headers(scope: Scope) -> dict[str, str]:
    """The headers the guard reads, the first of repeated ones (as Starlette's
    ``Headers.get``), in one pass over the request's."""
    headers: dict[str, str] = {}
    for name, value in scope["headers"]:
        if name in _READ:
            headers.setdefault(name.decode("latin-1"), value.decode("latin-1"))
    return headers


def _with_security_headers(send: Send) -> Send:
    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            present = {name.lower() for name, _ in message.get("headers", [])}
            extra = [(n, v) for n, v in SECURITY_HEADERS if n not in present]
            message["headers"] = [*message.get("headers", []), *extra]
        await send(message)

    return sending


def _too_large(limit: int) -> str:
    return f"request body larger than {limit} bytes (the limit set by TRAINYARD_MAX_BODY_BYTES)"


def _body_too_large(limit: int) -> JSONResponse:
    return _error(413, _too_large(limit), CLOSE)


def _error(status: int, detail: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"detail": detail}, status_code=status, headers=headers)
