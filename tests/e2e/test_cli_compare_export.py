"""`trainyard compare` and `trainyard export --tensorboard` against a real server and
worker: two tiny jobs trained once, then compared and exported."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import metadata as hparams_metadata

from tests.e2e.conftest import one_database
from tests.e2e.test_cli import cli
from tests.stack import Stack, wait_for
from trainyard import Client

pytestmark = pytest.mark.slow
CLIENT_SIDE = one_database("sqlite")


def _points(stack: Stack, job_id: int, **params: Any) -> list[dict[str, Any]]:
    r = stack.http.get(f"/jobs/{job_id}/metrics", params={"limit": 100_000, **params})
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


@CLIENT_SIDE
def test_compare_and_export_two_jobs(stack: Stack, tmp_path: Path) -> None:
    stack.start_worker()
    common = {"recipe": "tiny", "epochs": 3, "batch_size": 16, "max_attempts": 1}
    a = stack.submit(name="narrow one", lr=0.01, params={"width": 4}, **common)["id"]
    b = stack.submit(name="wide", lr=0.05, params={"width": 16}, **common)["id"]
    sweep = {
        "job": {**common, "lr": 0.02},
        "parameters": {"params.width": {"type": "categorical", "values": [4, 16]}},
        "search": "grid",
        "metric": "val/loss",
        "max_parallel": 2,
    }
    r = stack.http.post("/sweeps", json=sweep)
    assert r.status_code == 201, r.text
    sweep_id = r.json()["id"]
    for job_id in (a, b):
        assert stack.wait_status(job_id, {"succeeded", "failed"})["status"] == "succeeded"
    done = wait_for(
        lambda: (s := stack.http.get(f"/sweeps/{sweep_id}").json())["status"] != "running" and s,
        120,
        "the sweep to finish",
    )
    assert done["status"] == "finished" and len(done["trials"]) == 2, done

    # The table: both jobs, the fields they differ in (and not those they share), the
    # metric's last and best values and last step as the API has them.
    table = cli(stack, "compare", str(a), str(b), "--metric", "val/loss")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0] == "val/loss (min is best) of 2 jobs", lines
    header = lines[1].split()
    assert header == ["ID", "NAME", "STATUS", "REASON", "params.width", "lr"] + [
        "LAST",
        "BEST",
        "STEP",
    ], lines
    for job_id, name, lr, width, row in (
        (a, "narrow one", 0.01, 4, lines[2]),
        (b, "wide", 0.05, 16, lines[3]),
    ):
        val = _points(stack, job_id, name="val/loss")
        values = [p["value"] for p in val]
        assert row.split() == [
            str(job_id),
            *name.split(),
            "succeeded",
            stack.job(job_id)["reason"]["code"],
            str(width),
            f"{lr:.4g}",
            f"{values[-1]:.4g}",
            f"{min(values):.4g}",
            str(val[-1]["step"]),
        ], lines
    assert len(lines) == 4 and "no val/loss points" not in table.stderr  # no plot in a pipe

    # --json: the values themselves; the default metric is train/loss
    shown = json.loads(cli(stack, "compare", str(b), str(a), "--json").stdout)
    assert shown["metric"] == "train/loss" and shown["mode"] == "min"
    assert shown["fields"] == ["params.width", "lr"]
    assert [row["id"] for row in shown["jobs"]] == [a, b]
    for row in shown["jobs"]:
        train = _points(stack, row["id"], name="train/loss")
        assert row["last"] == train[-1]["value"] and row["step"] == train[-1]["step"]
        assert row["best"] == min(p["value"] for p in train) and row["points"] == len(train)

    # --plot draws the curves even in a pipe; a metric a job lacks is "-", and said so
    plotted = cli(stack, "compare", str(a), str(b), "--metric", "val/loss", "--plot")
    assert plotted.returncode == 0 and f"{a} narrow one" in plotted.stdout, plotted.stdout
    assert f"{b} wide" in plotted.stdout and "step" in plotted.stdout.splitlines()[-1]
    none = cli(stack, "compare", str(a), "--metric", "val/nothing")
    assert none.returncode == 0 and none.stdout.splitlines()[2].split()[-3:] == ["-"] * 3
    assert f"job {a}: no val/nothing points" in none.stderr

    missing = cli(stack, "compare", str(a), "9998", str(b), "9999")
    assert missing.returncode == 1 and missing.stdout == ""
    assert "error: no jobs 9998, 9999 on this server" in missing.stderr, missing.stderr

    # Paging: a page may end part-way through a step's points; every point comes once.
    everything = _points(stack, a)
    with Client(stack.url) as client:
        paged = client.metrics(a, page_size=3)
        one_by_one = client.metrics(a, "train/loss", page_size=1)
        grown = client.metrics(a, page_size=1)  # a step's points fill a page: it grows
    assert [p.model_dump() for p in paged] == everything
    assert [p.model_dump() for p in one_by_one] == [
        p for p in everything if p["name"] == "train/loss"
    ]
    assert [p.model_dump() for p in grown] == everything

    # Export: TensorBoard reads back exactly the API's points, and twice is not double.
    logdir = tmp_path / "tb"
    for _ in range(2):
        exported = cli(stack, "export", str(a), "--tensorboard", str(logdir))
        assert exported.returncode == 0, exported.stderr
    run = logdir / f"job-{a}-narrow-one"
    assert [p.name for p in logdir.iterdir()] == [run.name]
    assert len(list(run.iterdir())) == 1
    events = EventAccumulator(str(run), size_guidance={"scalars": 0})
    events.Reload()
    names = sorted({p["name"] for p in everything})
    assert sorted(events.Tags()["scalars"]) == names
    for name in names:
        api = [p for p in everything if p["name"] == name]
        read = events.Scalars(name)
        assert [(e.step, e.wall_time) for e in read] == [(p["step"], p["time"]) for p in api]
        # TensorBoard keeps a scalar as a 32-bit float
        assert [e.value for e in read] == pytest.approx([p["value"] for p in api], rel=1e-6)

    _check_sweep(stack, done, tmp_path / "sweep-tb")

    nothing = cli(stack, "export", "9999", "--tensorboard", str(logdir))
    assert nothing.returncode == 1 and "404" in nothing.stderr


def _check_sweep(stack: Stack, sweep: dict[str, Any], logdir: Path) -> None:
    """compare --sweep: its trials, on its metric, as the sweep itself sums them up;
    export --sweep: a run folder per trial, its values as hparams."""
    trials = sweep["trials"]
    shown = json.loads(cli(stack, "compare", "--sweep", str(sweep["id"]), "--json").stdout)
    assert shown["metric"] == "val/loss" and shown["fields"] == ["params.width"], shown
    assert [row["id"] for row in shown["jobs"]] == sorted(t["job_id"] for t in trials)
    by_job = {t["job_id"]: t for t in trials}
    for row in shown["jobs"]:
        trial = by_job[row["id"]]
        assert (row["last"], row["best"], row["step"]) == (
            trial["last"],
            trial["best"],
            trial["step"],
        )
        assert row["fields"]["params.width"] == trial["values"]["params.width"]

    exported = cli(stack, "export", "--sweep", str(sweep["id"]), "--tensorboard", str(logdir))
    assert exported.returncode == 0, exported.stderr
    runs = {f"trial-{t['number']:03d}-job-{t['job_id']}": t for t in trials}
    assert sorted(p.name for p in logdir.iterdir()) == sorted(runs)
    for folder, trial in runs.items():
        events = EventAccumulator(str(logdir / folder), size_guidance={"scalars": 0})
        events.Reload()
        assert events.Tags()["tensors"] == ["_hparams_/session_start_info"]
        content = events.SummaryMetadata("_hparams_/session_start_info").plugin_data.content
        start = hparams_metadata.parse_session_start_info_plugin_data(content)
        assert start.hparams["params.width"].number_value == trial["values"]["params.width"]
        val = _points(stack, trial["job_id"], name="val/loss")
        assert [e.step for e in events.Scalars("val/loss")] == [p["step"] for p in val]
