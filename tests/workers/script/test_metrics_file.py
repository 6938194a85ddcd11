"""A script's metrics file: complete lines become points and progress; a malformed line is
skipped, never fatal; a value that is not finite is stored as null; the helper module
writes lines the follower reads."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from service.points import MetricPoint, ProgressPoint
from workers.script.job import JOB_PATH
from workers.script.metrics_file import MetricsFile


class Points(list[MetricPoint | ProgressPoint]):
    def put_nowait(self, item: MetricPoint | ProgressPoint) -> None:
        self.append(item)

    def metrics(self) -> list[tuple[str, int, int, float | None]]:
        return [(p.name, p.step, p.epoch, p.value) for p in self if isinstance(p, MetricPoint)]

    def progress(self) -> list[ProgressPoint]:
        return [p for p in self if isinstance(p, ProgressPoint)]


def test_lines_become_points_and_progress(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    points = Points()
    follower = MetricsFile(path, points)
    assert follower.poll() == 0  # no file yet: nothing, no error
    path.write_text(
        '{"step": 10, "epoch": 1, "epochs": 3, "total_steps": 30, "train/loss": 0.5}\n'
        '{"step": 20, "val/accuracy": 0.9, "loss": NaN, "big": 1e999}\n'
        '{"step": 30, "train/loss": 0.2'  # still being written: waits for its newline
    )
    assert follower.poll() == 2
    assert points.metrics() == [
        ("train/loss", 10, 1, 0.5),
        ("val/accuracy", 20, 1, 0.9),  # no epoch said: still the last one's
        ("loss", 20, 1, None),  # NaN: stored as null
        ("big", 20, 1, None),  # inf
    ]
    first = points.progress()[0]
    assert (first.epoch, first.epochs, first.step, first.total_steps, first.loss) == (
        1, 3, 10, 30, 0.5,
    )  # fmt: skip
    # a line that says only a metric leaves the job where it was, not at epoch 0 of 0
    second = points.progress()[1]
    assert (second.epoch, second.epochs, second.step, second.total_steps) == (1, 3, 20, 30)
    with open(path, "a") as f:
        f.write("}\n")
    assert follower.poll() == 1
    assert points.metrics()[-1] == ("train/loss", 30, 1, 0.2)
    assert follower.final() == {"train/loss": 0.2, "val/accuracy": 0.9}


@pytest.mark.parametrize(
    "line",
    [
        "not json",
        "[1, 2]",
        '{"loss": 1}',  # no step
        '{"step": -1, "loss": 1}',
        '{"step": 1.5, "loss": 1}',
        '{"step": true, "loss": 1}',
        '{"step": 1, "loss": "high"}',
        '{"step": 1, "loss": true}',
        '{"step": 1, "loss": [1]}',
        '{"step": 99999999999, "loss": 1}',
        '{"step": 1, "": 1}',
        json.dumps({"step": 1, "x" * 101: 1}),
    ],
)
def test_a_malformed_line_is_skipped_and_the_next_is_read(tmp_path: Path, line: str) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text(f'{line}\n{{"step": 2, "loss": 1.0}}\n')
    points = Points()
    follower = MetricsFile(path, points)
    assert follower.poll() == 2
    assert follower.skipped == 1 and points.metrics() == [("loss", 2, 0, 1.0)]


def test_an_endless_line_is_skipped_whole(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text("x" * 100_000)  # no newline, past the longest line
    follower = MetricsFile(path, Points())
    follower.poll()
    assert follower.skipped == 1 and follower.offset == 100_000


def test_eta_comes_from_the_step_rate(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    points = Points()
    follower = MetricsFile(path, points)
    path.write_text('{"step": 10, "total_steps": 100}\n')
    follower.poll()
    time.sleep(0.2)
    with open(path, "a") as f:
        f.write('{"step": 20, "total_steps": 100}\n')
    follower.poll()
    first, second = points.progress()
    assert first.eta_s is None  # one line: no rate yet
    assert second.eta_s is not None and 0 < second.eta_s < 1.6 * 1.5  # ~80 steps at ~50/s


def test_the_helper_writes_what_the_follower_reads(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    code = (
        "import trainyard_job as t\n"
        "t.report(3, epoch=1, total_steps=9, **{'train/loss': 0.25, 'val/x': float('nan')})\n"
        "t.report(4, loss=1)\n"
    )
    env = {"PYTHONPATH": str(JOB_PATH), "TRAINYARD_METRICS_FILE": str(path)}
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
    points = Points()
    MetricsFile(path, points).poll()
    assert points.metrics() == [
        ("train/loss", 3, 1, 0.25),
        ("val/x", 3, 1, None),
        ("loss", 4, 1, 1.0),  # the epoch the last line said
    ]
    # outside Trainyard the helper does nothing (and needs nothing)
    subprocess.run([sys.executable, "-c", code], env={"PYTHONPATH": str(JOB_PATH)}, check=True)
