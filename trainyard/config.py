"""Where the server is and who you are, read the same way by the client and the CLI:
``TRAINYARD_URL`` (else the address ``trainyard serve`` on this box listens on, from
``TRAINYARD_HOST`` and ``TRAINYARD_PORT``) and ``TRAINYARD_API_TOKEN`` (else the first line
of the file ``TRAINYARD_API_TOKEN_FILE`` names, so that no shell's environment need hold
it)."""

from __future__ import annotations

import os
from pathlib import Path

from trainyard.errors import TrainyardError

# A server bound to every address is reached on loopback.
_ANY_ADDRESS = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}


class ConfigError(TrainyardError):
    """A TRAINYARD_* variable that cannot be used; the message names it."""


def server_url(url: str | None = None) -> str:
    """``url`` if given, else ``TRAINYARD_URL``, else this box's own server."""
    url = url or os.environ.get("TRAINYARD_URL")
    if url:
        return url.rstrip("/")
    host = os.environ.get("TRAINYARD_HOST", "127.0.0.1").strip()
    host = _ANY_ADDRESS.get(host, host)
    port = os.environ.get("TRAINYARD_PORT", "8000").strip()
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ConfigError(f"TRAINYARD_PORT: not a port number: {port!r}")
    return f"http://{f'[{host}]' if ':' in host else host}:{port}"


def api_token(token: str | None = None) -> str | None:
    """``token`` if given, else ``TRAINYARD_API_TOKEN``, else ``TRAINYARD_API_TOKEN_FILE``'s."""
    token = token or os.environ.get("TRAINYARD_API_TOKEN")
    if token:
        return token
    path = os.environ.get("TRAINYARD_API_TOKEN_FILE")
    if not path:
        return None
    try:
        return Path(path).read_text().strip().splitlines()[0]
    except (OSError, IndexError) as exc:
        raise ConfigError(f"TRAINYARD_API_TOKEN_FILE: cannot read a token from {path}") from exc
