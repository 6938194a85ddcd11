"""the queue as partial indexes (queued jobs only)

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Spelled as in service.models.QUEUED_ONLY (a migration does not import the models).
_QUEUED_ONLY = {f"{d}_where": sa.text("status = 'queued'") for d in ("sqlite", "postgresql")}


def upgrade() -> None:
    # The starvation check's "oldest queued job" had no index of its own: PostgreSQL,
    # with statistics taken while every job was queued, walked the primary key past every
    # job already claimed, once per claim (claims fell as the queue drained).
    op.drop_index("ix_job_claim", table_name="job")
    op.create_index("ix_job_claim", "job", [sa.text("priority DESC"), "id"], **_QUEUED_ONLY)
    op.create_index("ix_job_queued_id", "job", ["id"], **_QUEUED_ONLY)


def downgrade() -> None:
    op.drop_index("ix_job_queued_id", table_name="job")
    op.drop_index("ix_job_claim", table_name="job")
    op.create_index("ix_job_claim", "job", ["status", sa.text("priority DESC"), "id"])
