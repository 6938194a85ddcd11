"""event numbers for the event stream; the per-job log bound

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_JOB_COUNTERS = ("event_seq", "status_seq", "progress_seq", "log_count", "log_dropped")


def upgrade() -> None:
    with op.batch_alter_table("job", schema=None) as batch_op:
        for name in _JOB_COUNTERS:
            batch_op.add_column(sa.Column(name, sa.Integer(), nullable=False, server_default="0"))
        batch_op.add_column(sa.Column("log_marker_seq", sa.Integer(), nullable=True))
    with op.batch_alter_table("metric", schema=None) as batch_op:
        batch_op.add_column(sa.Column("seq", sa.Integer(), nullable=False, server_default="0"))

    # Number the rows already there: metric points after the job's log lines (whose seq
    # already counts from 1), then the job's current status and progress after both.
    # One pass with a window function (a correlated count per row would be quadratic in
    # a job's points). UPDATE ... FROM: PostgreSQL, and SQLite 3.33+.
    op.execute(
        """
        UPDATE metric SET seq = numbered.seq
        FROM (
            SELECT m.job_id, m.name, m.step,
                   ROW_NUMBER() OVER (PARTITION BY m.job_id ORDER BY m.step, m.name)
                   + COALESCE((SELECT MAX(l.seq) FROM log_line l WHERE l.job_id = m.job_id), 0)
                   AS seq
            FROM metric m
        ) AS numbered
        WHERE metric.job_id = numbered.job_id
          AND metric.name = numbered.name
          AND metric.step = numbered.step
        """
    )
    op.execute(
        """
        UPDATE job SET
          log_count = (SELECT COUNT(*) FROM log_line l WHERE l.job_id = job.id),
          event_seq = 2 + COALESCE((SELECT MAX(l.seq) FROM log_line l WHERE l.job_id = job.id), 0)
                        + (SELECT COUNT(*) FROM metric m WHERE m.job_id = job.id)
        """
    )
    op.execute("UPDATE job SET status_seq = event_seq - 1, progress_seq = event_seq")

    # The server defaults only served the rows above; the model supplies values from now on.
    with op.batch_alter_table("job", schema=None) as batch_op:
        for name in _JOB_COUNTERS:
            batch_op.alter_column(name, server_default=None)
    with op.batch_alter_table("metric", schema=None) as batch_op:
        batch_op.alter_column("seq", server_default=None)
        batch_op.create_index("ix_metric_job_seq", ["job_id", "seq"], unique=False)
    # SQLite's batch mode rebuilt `job` from reflection, which loses the DESC of the claim
    # index (the claim would then sort the queue): build it again as 0002 made it.
    op.drop_index("ix_job_claim", table_name="job")
    op.create_index("ix_job_claim", "job", ["status", sa.text("priority DESC"), "id"])


def downgrade() -> None:
    with op.batch_alter_table("metric", schema=None) as batch_op:
        batch_op.drop_index("ix_metric_job_seq")
        batch_op.drop_column("seq")
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.drop_column("log_marker_seq")
        for name in reversed(_JOB_COUNTERS):
            batch_op.drop_column(name)
