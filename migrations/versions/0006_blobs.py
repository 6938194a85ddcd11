"""blobs: the blob table and which jobs use each blob

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # New tables only: nothing to copy, so no batch mode is needed on SQLite.
    op.create_table(
        "blob",
        sa.Column("digest", sqlmodel.sql.sqltypes.AutoString(length=71), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("last_used_at", sa.DateTime(), nullable=True),
        sa.PrimaryKeyConstraint("digest"),
    )
    op.create_index("ix_blob_created_at", "blob", ["created_at"])
    op.create_table(
        "job_blob",
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("digest", sqlmodel.sql.sqltypes.AutoString(length=71), nullable=False),
        sa.Column("role", sqlmodel.sql.sqltypes.AutoString(length=200), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["job.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("job_id", "digest", "role"),
    )
    op.create_index("ix_job_blob_digest", "job_blob", ["digest"])


def downgrade() -> None:
    op.drop_index("ix_job_blob_digest", table_name="job_blob")
    op.drop_table("job_blob")
    op.drop_index("ix_blob_created_at", table_name="blob")
    op.drop_table("blob")
