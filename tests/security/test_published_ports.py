"""Careless neighbours: what the compose file publishes to the network.

Threat: PostgreSQL published on every interface of the box takes password guesses (and,
without TLS, shows the password and every job's data to the network path) from anyone
who can reach the port. It is published on loopback unless the operator names an
address, and the README says how boxes that reach it over a network use TLS."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


def with_defaults(text: str) -> str:
    """Compose's interpolation with no variable set: each ``${NAME:-default}`` as its default."""
    return re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", text)


def test_postgres_is_published_on_loopback_unless_told_otherwise() -> None:
    services = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]
    ports = [with_defaults(p) for p in services["postgres"]["ports"]]
    assert ports == ["127.0.0.1:5432:5432"]


def test_readme_says_how_remote_workers_reach_postgres_with_tls() -> None:
    deploying = (REPO / "README.md").read_text().split("### Several GPU boxes")[1]
    assert "POSTGRES_BIND" in deploying and "sslmode=verify-full" in deploying
