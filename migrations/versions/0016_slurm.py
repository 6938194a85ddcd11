"""Slurm: the executor's own id of a job's running attempt, and what kind of worker a
worker is (a box's, or one in front of a Slurm cluster) with how many nodes it offers

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

String = sqlmodel.sql.sqltypes.AutoString


def upgrade() -> None:
    # Nullable or with a server default: SQLite adds such columns in place.
    op.add_column("job", sa.Column("executor_id", String(length=64), nullable=True))
    op.add_column(
        "worker",
        sa.Column("executor", String(length=16), nullable=False, server_default="box"),
    )
    op.add_column(
        "worker", sa.Column("max_nodes", sa.Integer(), nullable=False, server_default="1")
    )


def downgrade() -> None:
    op.drop_column("worker", "max_nodes")
    op.drop_column("worker", "executor")
    op.drop_column("job", "executor_id")
