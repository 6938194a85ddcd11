"""worker.recipe_errors: the recipe sources a worker skipped, and why

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("worker", schema=None) as batch_op:
        # Rows of workers registered before it skipped nothing they could say.
        batch_op.add_column(
            sa.Column("recipe_errors", sa.JSON(), nullable=False, server_default="[]")
        )


def downgrade() -> None:
    with op.batch_alter_table("worker", schema=None) as batch_op:
        batch_op.drop_column("recipe_errors")
