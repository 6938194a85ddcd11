"""Webhooks: users' receivers, and the outbox of deliveries the server's dispatcher sends

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

String = sqlmodel.sql.sqltypes.AutoString
# Spelled as in service.webhooks.models.PENDING_ONLY (a migration does not import models).
_PENDING_ONLY = {f"{d}_where": sa.text("state = 'pending'") for d in ("sqlite", "postgresql")}


def upgrade() -> None:
    op.create_table(
        "webhook",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("owner", String(length=64), nullable=False),
        sa.Column("url", String(length=2000), nullable=False),
        sa.Column("events", sa.JSON(), nullable=False),
        sa.Column("secret", String(length=200), nullable=False),
        sa.Column("format", sa.String(length=16), nullable=False),
        sa.Column("all_users", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("active", sa.Boolean(), nullable=False),
        sa.ForeignKeyConstraint(["owner"], ["trainyard_user.name"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_webhook_owner", "webhook", ["owner", "id"])
    op.create_index("ix_webhook_all_users", "webhook", ["all_users"])
    op.create_table(
        "webhook_delivery",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("webhook_id", sa.Integer(), nullable=False),
        sa.Column("event", String(length=32), nullable=False),
        sa.Column("subject", String(length=64), nullable=False),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(), nullable=False),
        sa.Column("claimed_until", sa.DateTime(), nullable=True),
        sa.Column("last_status_code", sa.Integer(), nullable=True),
        sa.Column("last_error", String(length=1000), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("delivered_at", sa.DateTime(), nullable=True),
        sa.ForeignKeyConstraint(["webhook_id"], ["webhook.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(
        "ix_webhook_delivery_due", "webhook_delivery", ["next_attempt_at"], **_PENDING_ONLY
    )
    op.create_index("ix_webhook_delivery_webhook", "webhook_delivery", ["webhook_id", "id"])


def downgrade() -> None:
    op.drop_index("ix_webhook_delivery_webhook", table_name="webhook_delivery")
    op.drop_index("ix_webhook_delivery_due", table_name="webhook_delivery")
    op.drop_table("webhook_delivery")
    op.drop_index("ix_webhook_all_users", table_name="webhook")
    op.drop_index("ix_webhook_owner", table_name="webhook")
    op.drop_table("webhook")
