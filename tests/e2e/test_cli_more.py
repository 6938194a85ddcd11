"""More of the trainyard CLI against a real server and worker: where it finds the server,
a job's lifecycle from options to artifacts and rerun, and a recipe of an uploaded
package from options and from a job file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.test_cli import CLIENT_SIDE, cli
from tests.stack import REPO, Stack, free_port

pytestmark = pytest.mark.slow


def cli_env(
    stack: Stack, env: dict[str, str], *args: str, cwd: Path = REPO
) -> subprocess.CompletedProcess[str]:
    """The CLI with exactly this environment (no TRAINYARD_URL unless given)."""
    return subprocess.run(
        [sys.executable, "-m", "service.cli", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


@CLIENT_SIDE
def test_without_a_url_the_cli_finds_the_server_where_trainyard_port_puts_it(
    stack: Stack,
) -> None:
    """`TRAINYARD_PORT=8811 make run`, then `trainyard ls` with the same variable: the CLI
    reads TRAINYARD_HOST and TRAINYARD_PORT as the server does (it used to try port 8000
    whatever they said); where nothing answers, the error says how to point it."""
    env = {k: v for k, v in stack.env.items() if k != "TRAINYARD_URL"}
    assert env["TRAINYARD_PORT"] == stack.url.rsplit(":", 1)[1]
    listed = cli_env(stack, env, "ls")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.split() == ["ID", "STATUS", "OWNER", "WHAT", "RUNS", "REASON"]
    # a server bound to every address is reached on loopback
    anywhere = cli_env(stack, {**env, "TRAINYARD_HOST": "0.0.0.0"}, "ls")
    assert anywhere.returncode == 0, anywhere.stderr

    closed = free_port()
    missed = cli_env(stack, {**env, "TRAINYARD_PORT": str(closed)}, "ls")
    assert missed.returncode == 2
    assert f"cannot reach http://127.0.0.1:{closed}/api/v1" in missed.stderr, missed.stderr
    assert "--url or TRAINYARD_URL" in missed.stderr
    bad = cli_env(stack, {**env, "TRAINYARD_PORT": "http"}, "ls")
    assert bad.returncode == 2 and "TRAINYARD_PORT: not a port number: 'http'" in bad.stderr


@CLIENT_SIDE
def test_a_job_from_options_to_its_artifacts_and_a_rerun(stack: Stack, tmp_path: Path) -> None:
    """recipes, submit's training options, status in words (and --json), artifacts ls and
    get (to a file, a folder, the current one), rerun: each with a header or a whole
    field where it prints one."""
    stack.start_worker()
    offered = cli(stack, "recipes")
    assert offered.returncode == 0, offered.stderr
    heading, *rows = offered.stdout.splitlines()
    assert heading.split() == ["NAME", "SUMMARY"]
    assert any(r.split(None, 1) == ["tiny", "A four-feature linear target; can be slowed "
               "down or made to fail."] for r in rows), rows  # fmt: skip

    options = ["--lr", "0.01", "--seed", "7", "--priority", "5", "--retries-on-error", "2"]
    ran = cli(stack, "submit", "--recipe", "tiny", "--epochs", "1", *options, "--follow")
    assert ran.returncode == 0, ran.stderr
    job_id = int(ran.stdout)
    job = stack.job(job_id)
    assert (job["lr"], job["seed"], job["priority"], job["retries_on_error"]) == (0.01, 7, 5, 2)

    shown = cli(stack, "status", str(job_id))
    assert shown.returncode == 0, shown.stderr
    lines = [" ".join(line.split()) for line in shown.stdout.splitlines()]
    assert lines[0] == f"job {job_id}" and "status succeeded" in lines, lines
    assert "recipe tiny" in lines and "runs single x1 on cpu" in lines, lines
    assert "trains 1 epochs, batch 64, lr 0.01, adamw, fp32, seed 7" in lines, lines
    assert "attempts 1 of 3, retries_on_error 2; priority 5" in lines
    assert json.loads(cli(stack, "status", str(job_id), "--json").stdout) == stack.job(job_id)

    listed = cli(stack, "artifacts", "ls", str(job_id))
    assert listed.returncode == 0, listed.stderr
    heading, *rows = listed.stdout.splitlines()
    assert heading.split() == ["BYTES", "NAME"]
    sizes = {r.split()[1]: int(r.split()[0]) for r in rows}
    model = stack.http.get(f"/jobs/{job_id}/artifacts/model.safetensors").content
    assert sizes["model.safetensors"] == len(model) and "spec.json" in sizes

    here = tmp_path / "here"
    here.mkdir()
    got = cli_env(stack, {**stack.env, "TRAINYARD_URL": stack.url},
                  "artifacts", "get", str(job_id), "model.safetensors", cwd=here)  # fmt: skip
    assert got.returncode == 0, got.stderr
    assert (here / "model.safetensors").read_bytes() == model
    assert got.stdout.strip() == f"model.safetensors ({len(model)} bytes)"
    named = tmp_path / "weights.safetensors"
    cli(stack, "artifacts", "get", str(job_id), "model.safetensors", "-o", str(named))
    assert named.read_bytes() == model
    made = cli(stack, "artifacts", "get", str(job_id), "spec.json", "-o", f"{here}/new/")
    assert made.returncode == 0, made.stderr
    assert json.loads((here / "new" / "spec.json").read_text())["seed"] == 7
    missing = cli(stack, "artifacts", "get", str(job_id), "no-such-file")
    assert missing.returncode == 1 and "404" in missing.stderr
    assert sorted(p.name for p in here.iterdir()) == ["model.safetensors", "new"]

    again = cli(stack, "rerun", str(job_id), "--follow")
    assert again.returncode == 0, again.stderr
    rerun = stack.job(int(again.stdout))
    assert rerun["id"] != job_id and rerun["status"] == "succeeded"
    assert (rerun["lr"], rerun["seed"], rerun["priority"], rerun["retries_on_error"]) == (
        0.01, 7, 5, 2,
    )  # fmt: skip


ROWS_RECIPE = """
import os

import torch
from torch import nn
from torch.utils.data import TensorDataset
from pydantic import BaseModel

from workers.recipes import Recipe


class NoParams(BaseModel):
    pass


def datasets(p: NoParams, seed: int) -> tuple[TensorDataset, TensorDataset]:
    path = os.path.join(os.environ["TRAINYARD_INPUT_DIR"], "rows.csv")
    rows = [float(x) for x in open(path).read().split()]
    x = torch.tensor(rows).unsqueeze(1)
    return TensorDataset(x, 2 * x), TensorDataset(x, 2 * x)


ROWS = Recipe(
    name="rows",
    summary="y = 2x on the numbers in rows.csv.",
    params=NoParams,
    build_model=lambda p: nn.Linear(1, 1),
    build_datasets=datasets,
    loss=nn.functional.mse_loss,
)
"""


@CLIENT_SIDE
def test_a_recipe_of_a_package_from_options_and_from_a_job_file(
    stack: Stack, tmp_path: Path
) -> None:
    """`--code DIR --recipe NAME` runs a recipe the package defines (it used to ask for a
    command); a job file's `code:` and `data:` may be paths, relative to the file, packed
    and uploaded as the options are (they failed the digest pattern); `--data FILE` is
    placed under the file's own name. Digests print whole."""
    stack.start_worker()
    package = tmp_path / "package"
    package.mkdir()
    (package / "trainyard_recipes.py").write_text(ROWS_RECIPE)
    rows = tmp_path / "rows.csv"
    rows.write_text("\n".join(str(i) for i in range(16)))

    args = ["--code", str(package), "--recipe", "rows", "--data", str(rows)]
    ran = cli(stack, "submit", *args, "--accelerator", "cpu", "--epochs", "1", "--follow")
    assert ran.returncode == 0, ran.stderr
    job = stack.job(int(ran.stdout))
    assert job["status"] == "succeeded" and job["entrypoint"] is None
    code, data = job["code"], job["data"]["rows.csv"]
    assert f"code {package}: {code} uploaded (" in ran.stderr, ran.stderr
    assert f"data rows.csv: {data} uploaded (" in ran.stderr, ran.stderr

    spec = tmp_path / "jobs" / "rows.yaml"
    spec.parent.mkdir()
    spec.write_text("recipe: rows\ncode: ../package\ndata: {rows.csv: ../rows.csv}\nepochs: 1\n")
    filed = cli(stack, "submit", str(spec), "--accelerator", "cpu", "--follow")  # cwd: REPO
    assert filed.returncode == 0, filed.stderr
    assert filed.stderr.count("already uploaded") == 2, filed.stderr
    job = stack.job(int(filed.stdout))
    assert job["status"] == "succeeded" and (job["code"], job["data"]) == (code, {"rows.csv": data})

    both = cli(stack, "submit", *args, "--", "python", "train.py")
    assert both.returncode == 2 and "a command after -- runs a script: give one" in said(both)
    spec.write_text("recipe: rows\ncode: ../no-such-package\n")
    lost = cli(stack, "submit", str(spec))
    assert lost.returncode == 2, lost.stderr
    assert "code: ../no-such-package is neither a directory (relative to the job" in said(lost)
    assert stack.http.get("/jobs").json()["total"] == 2


def said(run: subprocess.CompletedProcess[str]) -> str:
    """stderr as one line: click's error box drawn away, its wrapping undone."""
    return " ".join(run.stderr.replace("│", " ").split())
