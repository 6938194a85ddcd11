"""Webhooks at the service level: the app's TestClient on each database, the dispatcher
run here in its drain mode (so a test knows when it has sent), real receivers on
127.0.0.1."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from service.app import create_app
from service.settings import Settings
from service.webhooks.dispatcher import Dispatcher
from tests.service.webhooks.receiver import Receiver, receiving


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """The suite's settings; the app's own dispatcher off: each test drains it itself."""
    return settings.model_copy(update={"webhook_dispatcher": False})


@pytest.fixture
def private_ok(settings: Settings) -> Settings:
    """The settings with private addresses allowed (the receivers are on loopback)."""
    return settings.model_copy(update={"webhook_allow_private_addresses": True})


@pytest.fixture
def dispatch(engine: Engine, private_ok: Settings) -> Callable[..., None]:
    """Send every due delivery now (private addresses allowed unless told otherwise)."""

    def run(**changes: Any) -> None:
        settings = private_ok.model_copy(update=changes)
        asyncio.run(Dispatcher(engine, settings).drain())

    return run


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with receiving() as r:
        yield r


def as_user(client: TestClient, name: str, admin: bool = False) -> dict[str, str]:
    """Add a user (as the bootstrap admin) and return headers that act as them."""
    r = client.post("/api/v1/users", json={"name": name, "admin": admin})
    assert r.status_code == 201, r.text
    r = client.post(f"/api/v1/users/{name}/tokens")
    assert r.status_code == 201, r.text
    return {"Authorization": f"Bearer {r.json()['token']}"}


@pytest.fixture
def loopback_client(private_ok: Settings, engine: Engine) -> Iterator[TestClient]:
    """The app with private addresses allowed: webhooks to the local receivers."""
    with TestClient(create_app(private_ok, engine)) as c:
        yield c
