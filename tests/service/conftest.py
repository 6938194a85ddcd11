"""Fixtures the service tests share."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine, text


@pytest.fixture
def db(engine: Engine) -> Engine:
    """The test's database with no blob rows (the PostgreSQL one is shared by the run)."""
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM job_blob"))
        conn.execute(text("DELETE FROM blob_upload"))
        conn.execute(text("DELETE FROM blob"))
    return engine
