"""A box a team shares: users (quotas, fair-share usage), their hashed API tokens, the
audit trail, and each job's owner

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01
"""

from collections.abc import Sequence
from datetime import UTC, datetime

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Spelled as in service.models (a migration does not import the models).
_QUEUED_ONLY = {f"{d}_where": sa.text("status = 'queued'") for d in ("sqlite", "postgresql")}
BOOTSTRAP_USER = "admin"
NO_USAGE = -1e300


def upgrade() -> None:
    user = op.create_table(
        "trainyard_user",
        sa.Column("name", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("admin", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("max_running_devices", sa.Integer(), nullable=True),
        sa.Column("max_queued_jobs", sa.Integer(), nullable=True),
        sa.Column("usage_score", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )
    op.create_index("ix_user_usage", "trainyard_user", ["usage_score", "name"])
    # The bootstrap admin: TRAINYARD_API_TOKEN's user, and every job's owner so far.
    now = datetime.now(UTC).replace(tzinfo=None)  # naive UTC, as the models store it
    op.bulk_insert(
        user,
        [{"name": BOOTSTRAP_USER, "admin": True, "created_at": now, "usage_score": NO_USAGE}],
    )
    op.create_table(
        "api_token",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("user_name", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("prefix", sqlmodel.sql.sqltypes.AutoString(length=16), nullable=False),
        sa.Column("token_hash", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("expires_at", sa.DateTime(), nullable=True),
        sa.Column("revoked_at", sa.DateTime(), nullable=True),
        sa.ForeignKeyConstraint(["user_name"], ["trainyard_user.name"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("token_hash"),
    )
    op.create_index("ix_api_token_user_name", "api_token", ["user_name"])
    op.create_table(
        "audit_event",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("at", sa.DateTime(), nullable=False),
        sa.Column("actor", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("action", sqlmodel.sql.sqltypes.AutoString(length=32), nullable=False),
        sa.Column("target", sqlmodel.sql.sqltypes.AutoString(length=200), nullable=False),
        sa.Column("detail", sa.JSON(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column(
                "owner",
                sqlmodel.sql.sqltypes.AutoString(length=64),
                nullable=False,
                server_default=BOOTSTRAP_USER,
            )
        )
    op.create_index(
        "ix_job_owner_claim", "job", ["owner", sa.text("priority DESC"), "id"], **_QUEUED_ONLY
    )
    op.create_index("ix_job_owner_status", "job", ["owner", "status"])


def downgrade() -> None:
    op.drop_index("ix_job_owner_status", table_name="job")
    op.drop_index("ix_job_owner_claim", table_name="job")
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.drop_column("owner")
    op.drop_table("audit_event")
    op.drop_index("ix_api_token_user_name", table_name="api_token")
    op.drop_table("api_token")
    op.drop_index("ix_user_usage", table_name="trainyard_user")
    op.drop_table("trainyard_user")
