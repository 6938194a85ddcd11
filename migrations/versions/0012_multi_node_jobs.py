"""Multi-node jobs: a job's nodes, and the gang of workers that run it

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Plain ADD COLUMN, not a batch: SQLite's batch would copy the table, and the copy
    # loses the DESC of the queue's indexes.
    op.add_column("job", sa.Column("nodes", sa.Integer(), nullable=False, server_default="1"))
    op.add_column(
        "worker",
        sa.Column("across_boxes", sa.Boolean(), nullable=False, server_default=sa.false()),
    )
    op.create_table(
        "job_node",
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("node", sa.Integer(), nullable=False),
        sa.Column("worker_id", sa.String(length=200), nullable=False),
        sa.Column("devices", sa.JSON(), nullable=False),
        sa.Column("endpoint", sa.String(length=300), nullable=False),
        sa.Column("joined_at", sa.DateTime(), nullable=False),
        sa.Column("renewed_at", sa.DateTime(), nullable=False),
        sa.Column("done_at", sa.DateTime(), nullable=True),
        sa.Column("runner_pgid", sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint("job_id", "node"),
    )
    op.create_index("ix_job_node_worker_id", "job_node", ["worker_id"])
    across_boxes = sa.text("status = 'queued' AND nodes > 1")
    op.create_index(
        "ix_job_gang",
        "job",
        [sa.text("priority DESC"), "id"],
        sqlite_where=across_boxes,
        postgresql_where=across_boxes,
    )


def downgrade() -> None:
    op.drop_index("ix_job_gang", table_name="job")
    op.drop_index("ix_job_node_worker_id", table_name="job_node")
    op.drop_table("job_node")
    with op.batch_alter_table("worker", schema=None) as batch_op:
        batch_op.drop_column("across_boxes")
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.drop_column("nodes")
