"""End-to-end fixtures: a real server per test (see tests/stack.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.stack import Stack, running_stack


def one_database(kind: str) -> pytest.MarkDecorator:
    """Run a test on one kind of database only: for what does not depend on it (the
    suite's time goes into end-to-end tests, most of it in starting stacks)."""
    return pytest.mark.parametrize("database_url", [kind], indirect=True)


@pytest.fixture
def stack(tmp_path: Path, database_url: str) -> Iterator[Stack]:
    """API server on a free port and a temp data dir, on each kind of database; tests
    start the workers they need."""
    with running_stack(tmp_path, database_url) as s:
        yield s
