"""job.gpu_memory_gb: a job that asks for part of one GPU, by memory

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("job", schema=None) as batch_op:
        # NULL: a whole GPU per device, as every job before asked for.
        batch_op.add_column(sa.Column("gpu_memory_gb", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.drop_column("gpu_memory_gb")
