"""The store's tables as Core objects, and the queue predicate the partial indexes need.

The store writes and reads rows through Core statements on these, not ORM objects,
where a query runs often: building a ``Job`` (its attribute instrumentation) costs
more than the query itself.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import literal_column

from service.models import Job, JobNode, JobStatus, LogLine

job_table = Job.__table__  # type: ignore[attr-defined]
log_table = LogLine.__table__  # type: ignore[attr-defined]
node_table = JobNode.__table__  # type: ignore[attr-defined]


def queued(job: Any) -> Any:
    """``status = 'queued'`` as a literal, the text the queue's partial indexes match."""
    return job.c.status == literal_column(f"'{JobStatus.queued.value}'")
