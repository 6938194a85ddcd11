"""Preemption: whether a job may be stopped for another, and when it last was

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Plain ADD COLUMN, not a batch: SQLite's batch would copy the table, and the copy
    # loses the DESC of the queue's indexes.
    op.add_column(
        "job", sa.Column("preemptible", sa.Boolean(), nullable=False, server_default=sa.true())
    )
    op.add_column("job", sa.Column("preempted_at", sa.DateTime(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.drop_column("preempted_at")
        batch_op.drop_column("preemptible")
