"""The typed points a training process reports are what the API shows."""

from __future__ import annotations

from dataclasses import fields

from service.models import MetricRead, Progress
from service.points import MetricPoint, ProgressPoint


def test_a_progress_point_has_exactly_the_fields_the_api_shows() -> None:
    # The store writes ProgressPoint.as_dict() into job.progress; the API reads it back
    # as Progress: a field in one and not the other would be silently lost.
    assert [f.name for f in fields(ProgressPoint)] == list(Progress.model_fields)
    point = ProgressPoint(epoch=1, epochs=2, step=3, total_steps=6, loss=0.5, eta_s=1.0)
    assert Progress.model_validate(point.as_dict()).model_dump() == point.as_dict()


def test_a_metric_point_is_what_the_api_reads() -> None:
    point = MetricPoint(name="train/loss", step=10, epoch=1, value=0.25, time=1.5)
    assert set(MetricRead.model_fields) == {f.name for f in fields(MetricPoint)}
    assert MetricRead.model_validate(point.as_dict()).model_dump() == point.as_dict()
