"""script jobs: a job runs a recipe or the user's own code (package, entrypoint, data,
requirements); recipe becomes optional; a metric value may be null

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


_QUEUED_ONLY = {
    f"{dialect}_where": sa.text("status = 'queued'") for dialect in ("sqlite", "postgresql")
}


def upgrade() -> None:
    # Batch mode: SQLite cannot drop NOT NULL in place, so it copies the table.
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.alter_column(
            "recipe", existing_type=sqlmodel.sql.sqltypes.AutoString(length=100), nullable=True
        )
        batch_op.add_column(
            sa.Column("code", sqlmodel.sql.sqltypes.AutoString(length=71), nullable=True)
        )
        batch_op.add_column(sa.Column("entrypoint", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("data", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("requirements", sa.JSON(), nullable=True))
    _restore_claim_index()
    # A script's NaN or infinite value is stored as NULL: the point stays in its series.
    with op.batch_alter_table("metric", schema=None) as batch_op:
        batch_op.alter_column("value", existing_type=sa.Float(), nullable=True)


def _restore_claim_index() -> None:
    """SQLite's copy rebuilds indexes from reflection, which keeps the claim index's WHERE
    but drops its DESC: built again as 0005 made it."""
    if op.get_bind().dialect.name != "sqlite":
        return
    op.drop_index("ix_job_claim", table_name="job")
    op.create_index("ix_job_claim", "job", [sa.text("priority DESC"), "id"], **_QUEUED_ONLY)


def downgrade() -> None:
    # Script jobs have no recipe to keep: they go with the columns that describe them.
    op.execute("DELETE FROM metric WHERE value IS NULL")
    with op.batch_alter_table("metric", schema=None) as batch_op:
        batch_op.alter_column("value", existing_type=sa.Float(), nullable=False)
    op.execute("DELETE FROM job WHERE recipe IS NULL")
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.drop_column("requirements")
        batch_op.drop_column("data")
        batch_op.drop_column("entrypoint")
        batch_op.drop_column("code")
        batch_op.alter_column(
            "recipe", existing_type=sqlmodel.sql.sqltypes.AutoString(length=100), nullable=False
        )
    _restore_claim_index()
