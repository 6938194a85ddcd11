"""Where the server may send a webhook: http or https, to public addresses only.

A webhook's URL is the user's, the request is the server's: without this guard a user
could have the server POST to its own loopback services, the cloud's metadata address
(169.254.169.254) or the private network behind it. The host is resolved and every
address it gives is checked, at create (a 422 naming the address) and again at each
delivery, since a name can resolve elsewhere later; the delivery then connects to the
address it checked, never to a fresh lookup (``pinned``). Redirects are never followed.
``TRAINYARD_WEBHOOK_ALLOW_PRIVATE_ADDRESSES`` lifts the address check (a team whose
receivers are on its own network; the tests' local receivers).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Callable
from urllib.parse import SplitResult, urlsplit, urlunsplit

from service.errors import WebhookAddressRefused

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
ALLOW_SETTING = "TRAINYARD_WEBHOOK_ALLOW_PRIVATE_ADDRESSES"
NAT64 = ipaddress.ip_network("64:ff9b::/96")  # the well-known prefix: IPv4 inside IPv6

# The kinds of address refused, in the order they are named.
REFUSED_KINDS: tuple[tuple[str, Callable[[Address], bool]], ...] = (
    ("unspecified", lambda ip: ip.is_unspecified),
    ("loopback", lambda ip: ip.is_loopback),
    ("link-local", lambda ip: ip.is_link_local),
    ("multicast", lambda ip: ip.is_multicast),
    ("private", lambda ip: ip.is_private),
    ("reserved", lambda ip: ip.is_reserved),
    ("non-public", lambda ip: not ip.is_global),  # shared (100.64/10) and the like
)


def refusal(ip: Address) -> str | None:
    """Why no webhook may be sent to ``ip`` ("loopback", "private" ...), or None."""
    if isinstance(ip, ipaddress.IPv6Address):
        # An IPv4 address written as IPv6 reaches the IPv4 one: judged as that.
        embedded = ip.ipv4_mapped or ip.sixtofour
        if embedded is None and ip in NAT64:
            embedded = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        if embedded is not None:
            why = refusal(embedded)
            return None if why is None else f"IPv4-embedded {why}"
    for kind, test in REFUSED_KINDS:
        if test(ip):
            return kind
    return None


def parts_of(url: str) -> tuple[SplitResult, str, int]:
    """The URL split, its host and its port (the scheme's when none is given)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    return parts, host, parts.port or (443 if parts.scheme == "https" else 80)


def shown(url: str) -> str:
    """The URL as logs may print it: scheme, host and port only. A user and password, or
    a path that is itself a secret (a Slack webhook's), stay out of the logs."""
    parts, host, port = parts_of(url)
    host = f"[{host}]" if ":" in host else host
    return f"{parts.scheme}://{host}:{port}"


def masked(url: str, *, secret_path: bool) -> str:
    """The URL with its password as ``***``, without its query (a token may ride there),
    and with ``secret_path`` its last path part as ``***`` too (a Slack webhook's token)."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if parts.password is not None:
        netloc = netloc.replace(f":{parts.password}@", ":***@", 1)
    path = parts.path
    if secret_path and path.rstrip("/"):
        path = path.rstrip("/").rsplit("/", 1)[0] + "/***"
    return urlunsplit((parts.scheme, netloc, path, "", ""))


def check_addresses(host: str, addresses: list[str], allow_private: bool) -> str:
    """The address to connect to for ``host`` (the first it resolved to), once every
    address it resolved to is one the server may send to; else WebhookAddressRefused."""
    if not addresses:
        raise WebhookAddressRefused(f"{host} resolves to no address")
    for address in addresses:
        why = None if allow_private else refusal(ipaddress.ip_address(address))
        if why is not None:
            # a name's address is not said: a user could map the box's internal names
            named = f"{address} is" if address == host else f"{host} resolves to"
            raise WebhookAddressRefused(
                f"{named} a {why} address: webhooks go to public addresses only "
                f"(an operator may allow others with {ALLOW_SETTING})"
            )
    return addresses[0]


def _unique(infos: list[tuple[object, ...]]) -> list[str]:
    addresses = [str(info[4][0]) for info in infos]  # type: ignore[index]
    return list(dict.fromkeys(a.split("%")[0] for a in addresses))  # no IPv6 scope id


def check_url(url: str, allow_private: bool) -> None:
    """At create: refuse a URL whose host is, or resolves to, an address the server may
    not send to (it blocks on DNS: call it off the event loop)."""
    if allow_private:
        return
    _parts, host, port = parts_of(url)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise WebhookAddressRefused(f"{host} does not resolve: {exc}") from None
    check_addresses(host, _unique(list(infos)), allow_private)


async def pinned(host: str, port: int, allow_private: bool) -> str:
    """At each delivery: the checked address to connect to (see ``check_addresses``);
    resolved without blocking the event loop."""
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise ConnectionError(f"{host} does not resolve: {exc}") from None
    return check_addresses(host, _unique(list(infos)), allow_private)
