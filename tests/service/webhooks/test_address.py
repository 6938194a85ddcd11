"""The address guard: which addresses a webhook may never reach, however written."""

from __future__ import annotations

import asyncio
import ipaddress

import pytest

from service.errors import WebhookAddressRefused
from service.webhooks.address import check_url, pinned, refusal, shown


@pytest.mark.parametrize(
    ("address", "kind"),
    [
        ("127.0.0.1", "loopback"),
        ("127.8.9.10", "loopback"),
        ("::1", "loopback"),
        ("10.0.0.7", "private"),
        ("172.16.3.4", "private"),
        ("192.168.1.1", "private"),
        ("fd00::1", "private"),
        ("169.254.169.254", "link-local"),
        ("fe80::1", "link-local"),
        ("224.0.0.1", "multicast"),
        ("ff02::1", "multicast"),
        ("0.0.0.0", "unspecified"),
        ("::", "unspecified"),
        ("240.0.0.1", "private"),  # reserved for future use: private to Python too
        ("100.64.0.1", "non-public"),  # carrier-grade NAT's shared space
        ("::ffff:127.0.0.1", "IPv4-embedded loopback"),
        ("::ffff:169.254.169.254", "IPv4-embedded link-local"),
        ("2002:a00:1::", "IPv4-embedded private"),  # 6to4 of 10.0.0.1
        ("64:ff9b::7f00:1", "IPv4-embedded loopback"),  # NAT64 of 127.0.0.1
    ],
)
def test_non_public_addresses_are_refused_by_kind(address: str, kind: str) -> None:
    assert refusal(ipaddress.ip_address(address)) == kind


@pytest.mark.parametrize("address", ["93.184.215.14", "8.8.8.8", "2606:4700::1111"])
def test_public_addresses_are_not(address: str) -> None:
    assert refusal(ipaddress.ip_address(address)) is None


def test_a_name_is_judged_by_what_it_resolves_to_now() -> None:
    with pytest.raises(WebhookAddressRefused, match=r"localhost resolves to .*loopback"):
        check_url("http://localhost:8000/x", allow_private=False)
    check_url("http://localhost:8000/x", allow_private=True)
    with pytest.raises(WebhookAddressRefused, match="loopback"):
        asyncio.run(pinned("localhost", 80, allow_private=False))
    assert asyncio.run(pinned("localhost", 80, allow_private=True)) in ("127.0.0.1", "::1")
    with pytest.raises(WebhookAddressRefused, match="does not resolve"):
        check_url("http://name.invalid/x", allow_private=False)


def test_logs_show_no_credential_nor_path() -> None:
    secret_url = "https://user:pass@hooks.slack.com/services/T0/B0/XYZsecret?token=t"
    assert shown(secret_url) == "https://hooks.slack.com:443"
    assert shown("http://[::1]:9000/a") == "http://[::1]:9000"
