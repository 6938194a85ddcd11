"""The catalog: the cache answers a submit within its time to live
without asking the database, worker registered yet or not; the recipe sources a worker
skipped, and why.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from sqlalchemy import Engine, event, text

from service.catalog import CatalogCache, list_workers, register_worker
from service.db import make_engine, read_session
from service.errors import SpecInvalid
from service.migrate import alembic_config, upgrade
from service.models import JobCreate, Worker
from service.reasons import ReasonCode
from tests.databases import throwaway_postgres

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


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_a_worker_registered_before_recipe_errors_existed_lists_none(
    kind: str, tmp_path: Path
) -> None:
    """Migration 0008 gives the rows already there an empty list, on both databases."""
    with ExitStack() as stack:
        if kind == "sqlite":
            url = f"sqlite:///{tmp_path / 'old.db'}"
        else:
            url = stack.enter_context(throwaway_postgres(migrate=False))
        command.upgrade(alembic_config(url), "0007")
        engine = make_engine(url)
        stack.callback(engine.dispose)
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO worker (id, hostname, pid, accelerator, devices, recipes, "
                    "started_at, heartbeat_at) VALUES ('old', 'h', 1, 'cpu', '[]', '[]', "
                    "'2026-01-01', '2026-01-01')"
                )
            )
        upgrade(url)
        with read_session(engine) as session:
            [worker] = list_workers(session)
    assert worker.id == "old" and worker.recipe_errors == []


def test_a_retry_s_wait_goes_on_the_first_line_of_its_reason(
    engine: Engine, add_worker: Callable[..., Worker]
) -> None:
    """A failed script's reason goes on with its last lines on stderr; what the requeued
    job waits for belongs with the why on the first line, not after the traceback."""
    from datetime import timedelta

    from service.catalog import load_catalog, waiting_reason
    from service.models import Job, utcnow

    add_worker("w1")
    failed = (
        "the script exited with 1 (attempt 1 of 3; retrying)\n  x = (\n"
        "SyntaxError: '(' was never closed"
    )
    job = Job(**SPEC.model_dump(), reason_code=ReasonCode.error, reason_message=failed)
    job.run_after = utcnow() + timedelta(seconds=30)
    with read_session(engine) as session:
        reason = waiting_reason(load_catalog(session), job, 1)
    first, *rest = reason.message.splitlines()
    assert first.startswith("the script exited with 1 (attempt 1 of 3; retrying); retrying in ")
    assert rest == ["  x = (", "SyntaxError: '(' was never closed"]
