"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "job",
        sa.Column("name", sqlmodel.sql.sqltypes.AutoString(length=100), nullable=True),
        sa.Column("recipe", sqlmodel.sql.sqltypes.AutoString(length=100), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("strategy", sa.String(length=16), nullable=False),
        sa.Column("devices", sa.Integer(), nullable=False),
        sa.Column("accelerator", sa.String(length=16), nullable=False),
        sa.Column("epochs", sa.Integer(), nullable=False),
        sa.Column("batch_size", sa.Integer(), nullable=False),
        sa.Column("lr", sa.Float(), nullable=False),
        sa.Column("optimizer", sa.String(length=16), nullable=False),
        sa.Column("seed", sa.Integer(), nullable=False),
        sa.Column("precision", sa.String(length=16), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("timeout_s", sa.Integer(), nullable=True),
        sa.Column("checkpoint_every", sa.Integer(), nullable=False),
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("reason_code", sqlmodel.sql.sqltypes.AutoString(length=32), nullable=True),
        sa.Column("reason_message", sqlmodel.sql.sqltypes.AutoString(length=2000), nullable=True),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("progress", sa.JSON(), nullable=True),
        sa.Column("error", sa.JSON(), nullable=True),
        sa.Column("result", sa.JSON(), nullable=True),
        sa.Column("worker_id", sqlmodel.sql.sqltypes.AutoString(length=200), nullable=True),
        sa.Column("lease_token", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(), nullable=True),
        sa.Column("assigned_devices", sa.JSON(), nullable=True),
        sa.Column("runner_pgid", sa.Integer(), nullable=True),
        sa.Column("run_after", sa.DateTime(), nullable=True),
        sa.Column("idempotency_key", sqlmodel.sql.sqltypes.AutoString(length=200), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("started_at", sa.DateTime(), nullable=True),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("idempotency_key"),
    )
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.create_index("ix_job_claim", ["status", "priority", "id"], unique=False)
        batch_op.create_index("ix_job_worker", ["worker_id", "status"], unique=False)

    op.create_table(
        "worker",
        sa.Column("id", sqlmodel.sql.sqltypes.AutoString(length=200), nullable=False),
        sa.Column("hostname", sqlmodel.sql.sqltypes.AutoString(length=255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("accelerator", sqlmodel.sql.sqltypes.AutoString(length=8), nullable=False),
        sa.Column("devices", sa.JSON(), nullable=False),
        sa.Column("recipes", sa.JSON(), nullable=False),
        sa.Column("started_at", sa.DateTime(), nullable=False),
        sa.Column("heartbeat_at", sa.DateTime(), nullable=False),
        sa.Column("stopped_at", sa.DateTime(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_table(
        "log_line",
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("time", sa.Float(), nullable=False),
        sa.Column("stream", sqlmodel.sql.sqltypes.AutoString(length=8), nullable=False),
        sa.Column("text", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["job.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("job_id", "seq"),
    )
    op.create_table(
        "metric",
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("name", sqlmodel.sql.sqltypes.AutoString(length=100), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("epoch", sa.Integer(), nullable=False),
        sa.Column("value", sa.Float(), nullable=False),
        sa.Column("time", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["job.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("job_id", "name", "step"),
    )


def downgrade() -> None:
    op.drop_table("metric")
    op.drop_table("log_line")
    op.drop_table("worker")
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.drop_index("ix_job_worker")
        batch_op.drop_index("ix_job_claim")

    op.drop_table("job")
