"""The catalog cache (issue 16 item 14): a submit within its time to live asks the
database nothing, whether or not a worker has registered yet."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import Engine, event

from service.catalog import CatalogCache, register_worker
from service.errors import SpecInvalid
from service.models import JobCreate, Worker
from service.reasons import ReasonCode

SPEC = JobCreate.model_validate(
    {"recipe": "tiny", "strategy": "single", "devices": 1, "accelerator": "cpu", "epochs": 1}
)


@contextmanager
def worker_queries(engine: Engine) -> Iterator[list[str]]:
    """The statements about workers sent to the database meanwhile."""
    sent: list[str] = []

    def keep(_c: Any, _cur: Any, statement: str, *_: Any) -> None:
        if "worker" in statement:
            sent.append(statement)

    event.listen(engine, "before_cursor_execute", keep)
    try:
        yield sent
    finally:
        event.remove(engine, "before_cursor_execute", keep)


def test_the_empty_catalog_is_cached_like_any_other(engine: Engine) -> None:
    """Before any worker registered, every submit used to read the workers again (a
    thread hop and a query each: half the submit rate of a registered box)."""
    cache = CatalogCache(ttl_s=3600)
    with worker_queries(engine) as sent:
        first = cache.check(engine, SPEC)
        read = len(sent)
        assert first[0] == ReasonCode.no_worker and read > 0
        for _ in range(5):
            assert cache.check_cached(SPEC) == first  # answered without a query
            assert cache.check(engine, SPEC) == first
        assert len(sent) == read


def test_a_spec_the_cached_catalog_refuses_is_checked_as_of_now(
    engine: Engine, add_worker: Callable[..., Worker]
) -> None:
    """Refusing stays fresh: a worker offering the recipe may have registered a moment
    ago, so a refusal is never made from the cache alone."""
    cache = CatalogCache(ttl_s=3600)
    devices = [{"index": 0, "kind": "cpu", "name": "slot 0"}]
    register_worker(
        engine, Worker(id="w1", hostname="t", pid=1, accelerator="cpu", devices=devices)
    )
    with pytest.raises(SpecInvalid):
        cache.check(engine, SPEC)  # nobody offers tiny
    assert cache.check_cached(SPEC) is None  # the cache would refuse: not its answer alone
    add_worker("w2")
    assert cache.check(engine, SPEC)[0] == ReasonCode.queued
