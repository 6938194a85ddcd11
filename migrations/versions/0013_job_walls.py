"""Each worker's walls around its jobs: the account they run as, their network

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Plain ADD COLUMN, as in 0012: a batch would copy the table.
    op.add_column("worker", sa.Column("job_walls", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("worker", schema=None) as batch_op:
        batch_op.drop_column("job_walls")
