"""Sweeps: a sweep's row and its trials' rows, and the sweep a job is a trial of

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

String = sqlmodel.sql.sqltypes.AutoString


def upgrade() -> None:
    op.create_table(
        "sweep",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("owner", String(length=64), nullable=False),
        sa.Column("name", String(length=100), nullable=True),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("reason_code", String(length=32), nullable=True),
        sa.Column("reason_message", String(length=2000), nullable=True),
        sa.Column("driver_id", String(length=200), nullable=True),
        sa.Column("lease_token", String(length=64), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_sweep_owner", "sweep", ["owner"])
    op.create_index("ix_sweep_status", "sweep", ["status", "id"])
    op.create_table(
        "sweep_trial",
        sa.Column("sweep_id", sa.Integer(), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=True),
        sa.Column("values", sa.JSON(), nullable=False),
        sa.Column("system_attrs", sa.JSON(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("value", sa.Float(), nullable=True),
        sa.Column("ended_at", sa.DateTime(), nullable=True),
        sa.Column("message", String(length=2000), nullable=True),
        sa.ForeignKeyConstraint(["job_id"], ["job.id"]),
        sa.ForeignKeyConstraint(["sweep_id"], ["sweep.id"]),
        sa.PrimaryKeyConstraint("sweep_id", "number"),
        sa.UniqueConstraint("job_id"),
    )
    # No foreign key to sweep: adding one to SQLite's job table would copy the table.
    op.add_column("job", sa.Column("sweep_id", sa.Integer(), nullable=True))
    op.create_index("ix_job_sweep", "job", ["sweep_id"])


def downgrade() -> None:
    op.drop_index("ix_job_sweep", table_name="job")
    op.drop_column("job", "sweep_id")  # SQLite drops an unindexed column in place
    op.drop_table("sweep_trial")
    op.drop_index("ix_sweep_status", table_name="sweep")
    op.drop_index("ix_sweep_owner", table_name="sweep")
    op.drop_table("sweep")
