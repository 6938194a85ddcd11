"""claim and listing indexes

The claim orders by priority DESC, id ASC: an index in that order lets SQLite read the
next job instead of sorting the queue on every claim (200 -> thousands of claims/s).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.drop_index("ix_job_claim")
        batch_op.create_index(
            "ix_job_claim", ["status", sa.desc(sa.column("priority")), "id"], unique=False
        )
        batch_op.create_index("ix_job_status_id", ["status", "id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.drop_index("ix_job_status_id")
        batch_op.drop_index("ix_job_claim")
        batch_op.create_index("ix_job_claim", ["status", "priority", "id"], unique=False)
