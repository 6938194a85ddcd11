"""Who uploaded each blob, Idempotency-Keys scoped to their owner, retries of a job's own
failure, the attempt a preemption stopped, and each worker's cache

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

QUEUED = sa.text("status = 'queued'")
ACROSS_BOXES = sa.text("status = 'queued' AND nodes > 1")

# The job table's partial, descending indexes, as service.models declares them. SQLite
# drops the unique constraint of 0001 only by copying the table, and the copy would keep
# neither their DESC nor their WHERE: they are dropped before and made again after.
PARTIAL_INDEXES: list[tuple[str, list[sa.TextClause | str], sa.TextClause]] = [
    ("ix_job_claim", [sa.text("priority DESC"), "id"], QUEUED),
    ("ix_job_queued_id", ["id"], QUEUED),
    ("ix_job_gang", [sa.text("priority DESC"), "id"], ACROSS_BOXES),
    ("ix_job_owner_claim", ["owner", sa.text("priority DESC"), "id"], QUEUED),
]


def upgrade() -> None:
    op.create_table(
        "blob_upload",
        sa.Column("digest", sa.String(length=71), nullable=False),
        sa.Column("uploader", sa.String(length=64), nullable=False),
        sa.Column("uploaded_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("digest", "uploader"),
    )
    op.create_index("ix_blob_upload_uploader", "blob_upload", ["uploader"])
    op.add_column("worker", sa.Column("cache", sa.JSON(), nullable=True))
    op.add_column(
        "job", sa.Column("retries_on_error", sa.Integer(), nullable=False, server_default="0")
    )
    op.add_column("job", sa.Column("preempted_attempt", sa.Integer(), nullable=True))

    # An Idempotency-Key was unique across all users; now it is unique per owner.
    if op.get_bind().dialect.name == "postgresql":
        op.drop_constraint("job_idempotency_key_key", "job", type_="unique")
    else:
        for name, _, _ in PARTIAL_INDEXES:
            op.drop_index(name, table_name="job")
        # 0001's constraint has no name in SQLite (this one's downgrade names it): the
        # convention gives it one to drop by
        unique = sa.inspect(op.get_bind()).get_unique_constraints("job")
        name = next(u["name"] for u in unique if u["column_names"] == ["idempotency_key"])
        with op.batch_alter_table(
            "job", naming_convention={"uq": "uq_%(table_name)s_%(column_0_name)s"}
        ) as batch_op:
            batch_op.drop_constraint(name or "uq_job_idempotency_key", type_="unique")
        for name, columns, where in PARTIAL_INDEXES:
            op.create_index(name, "job", columns, sqlite_where=where)
    op.create_index(
        "ux_job_owner_idempotency_key", "job", ["owner", "idempotency_key"], unique=True
    )


def downgrade() -> None:
    # (Refused once two owners have used one key: the global constraint cannot come back
    # over such rows; clear one of them first.)
    op.drop_index("ux_job_owner_idempotency_key", table_name="job")
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.create_unique_constraint("job_idempotency_key_key", ["idempotency_key"])
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.drop_column("retries_on_error")
        batch_op.drop_column("preempted_attempt")
    with op.batch_alter_table("worker", schema=None) as batch_op:
        batch_op.drop_column("cache")
    op.drop_index("ix_blob_upload_uploader", table_name="blob_upload")
    op.drop_table("blob_upload")
