"""``trainyard sweep`` against a real server and worker: create and follow, status,
cancel, a refused file."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.e2e.conftest import one_database
from tests.stack import REPO, Stack, wait_for

pytestmark = pytest.mark.slow
# The CLI talks HTTP: which database the server uses is the API's tests' concern.
CLIENT_SIDE = one_database("sqlite")


def _env(stack: Stack) -> dict[str, str]:
    # wide enough that rich draws every column of the table in full
    return {**stack.env, "TRAINYARD_URL": stack.url, "COLUMNS": "160"}


def cli(stack: Stack, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "service.cli", *args],
        env=_env(stack),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def sweep_file(tmp_path: Path, **body: object) -> str:
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(body))
    return str(path)


def rows(table: str) -> dict[str, list[str]]:
    """The table's trial rows by their first cell (the number, ``*`` on the best)."""
    found = {}
    for line in table.splitlines():
        cells = [c.strip() for c in re.split(r"[│┃]", line)[1:-1]]
        if cells and re.fullmatch(r"\d+\*?", cells[0]):
            found[cells[0]] = cells
    return found


@CLIENT_SIDE
def test_create_follow_draws_every_trial_marks_the_best_and_status_matches(
    stack: Stack, tmp_path: Path
) -> None:
    stack.start_worker()
    file = sweep_file(
        tmp_path,
        name="grid",
        job={"recipe": "tiny", "epochs": 2, "params": {"samples": 64}},
        parameters={
            "lr": {"type": "categorical", "values": [0.01, 0.1]},
            "params.width": {"type": "categorical", "values": [4, 8]},
        },
        search="grid",
        metric="val/loss",
        mode="min",
        max_parallel=2,
    )
    done = cli(stack, "sweep", "create", file, "--follow")
    assert done.returncode == 0, done.stderr
    sweep_id = int(done.stdout.strip())  # stdout is the id alone: the table is on stderr
    sweep = stack.http.get(f"/sweeps/{sweep_id}").json()
    assert sweep["status"] == "finished" and sweep["counts"]["succeeded"] == 4
    best = sweep["best"]["number"]

    # the final table: every trial with its values, ended, at its last epoch; the best marked
    drawn = rows(done.stderr)
    assert len(drawn) == 4 and f"{best}*" in drawn, done.stderr
    for trial in sweep["trials"]:
        cells = drawn[f"{trial['number']}{'*' if trial['number'] == best else ''}"]
        assert cells[1:] == [
            f"{trial['values']['lr']:.4g}",
            str(trial["values"]["params.width"]),
            "succeeded",
            f"{trial['last']:.4g}",
            f"{trial['best']:.4g}",
            "2/2",
            str(trial["job_id"]),
        ], cells
    # ranked by the metric's last value, as the search was told
    assert f"best: trial {best} val/loss {sweep['best']['last']:.4g} " in done.stderr

    shown = cli(stack, "sweep", "status", str(sweep_id), "--json")
    assert shown.returncode == 0 and json.loads(shown.stdout) == sweep
    listed = cli(stack, "sweep", "ls")
    [row] = listed.stdout.splitlines()[1:]
    assert row.split()[:5] == [str(sweep_id), "finished", "admin", "grid", "4/4"], row


@CLIENT_SIDE
def test_interrupted_follow_leaves_the_sweep_running_and_cancel_ends_every_trial(
    stack: Stack, tmp_path: Path
) -> None:
    stack.start_worker()
    file = sweep_file(
        tmp_path,
        job={"recipe": "tiny", "epochs": 50, "params": {"sleep_per_step_s": 0.2}},
        parameters={"lr": {"type": "categorical", "values": [0.01, 0.02, 0.03]}},
        search="grid",
        metric="val/loss",
        max_parallel=2,
    )
    follow = subprocess.Popen(
        [sys.executable, "-m", "service.cli", "sweep", "create", file, "--follow"],
        env=_env(stack),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert follow.stdout is not None
    sweep_id = int(follow.stdout.readline())
    wait_for(
        lambda: stack.http.get(f"/sweeps/{sweep_id}").json()["counts"]["running"] == 2,
        60,
        "two trials to run",
    )
    follow.send_signal(signal.SIGINT)  # Ctrl-C: stop watching, not the sweep
    _, err = follow.communicate(timeout=30)
    assert follow.returncode == 130, err
    assert f"trainyard sweep cancel {sweep_id}" in err
    assert stack.http.get(f"/sweeps/{sweep_id}").json()["status"] == "running"

    cancelled = cli(stack, "sweep", "cancel", str(sweep_id))
    assert cancelled.returncode == 0, cancelled.stderr
    assert cancelled.stdout.startswith(f"sweep {sweep_id}: cancelled; cancelled trials ")
    sweep = wait_for(
        lambda: (
            (s := stack.http.get(f"/sweeps/{sweep_id}").json())["counts"]["running"] == 0
            and s["counts"]["queued"] == 0
            and s
        ),
        60,
        "every trial to end",
    )
    assert sweep["status"] == "cancelled"
    assert {t["status"] for t in sweep["trials"]} <= {"cancelled", "succeeded", "failed"}
    jobs = stack.http.get("/jobs", params={"sweep": sweep_id}).json()["items"]
    assert jobs and all(j["status"] == "cancelled" for j in jobs)


@CLIENT_SIDE
def test_a_refused_sweep_file_exits_1_naming_the_parameter(stack: Stack, tmp_path: Path) -> None:
    file = sweep_file(
        tmp_path,
        job={"recipe": "tiny"},
        parameters={"lr": {"type": "float", "low": 0.5, "high": 0.1}},
        metric="val/loss",
    )
    r = cli(stack, "sweep", "create", file)
    assert r.returncode == 1 and r.stdout == "", (r.stdout, r.stderr)  # as submit's
    assert "error 422: parameters.lr: " in r.stderr, r.stderr
    assert stack.http.get("/sweeps").json()["total"] == 0
