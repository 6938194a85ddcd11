"""The trainyard CLI against a real server and worker."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from service.cli.inputs import PACKAGE_WARN_BYTES
from service.migrate import head_revision
from tests.e2e.conftest import one_database
from tests.stack import RECIPES_DIR, REPO, Stack, free_port, running_stack, stack_env, wait_for
from tests.workers.script.test_venvs import make_wheel

pytestmark = pytest.mark.slow
# The CLI talks HTTP: which database the server uses is the API's tests' concern.
CLIENT_SIDE = one_database("sqlite")


def cli(stack: Stack, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "service.cli", *args],
        env={**stack.env, "TRAINYARD_URL": stack.url},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@CLIENT_SIDE
def test_submit_follow_exit_code_says_how_the_job_ended(stack: Stack, tmp_path: Path) -> None:
    stack.start_worker()
    ok = cli(stack, "submit", "--recipe", "tiny", "--epochs", "2", "-p", "width=4", "--follow")
    assert ok.returncode == 0, ok.stderr
    job_id = int(ok.stdout.strip())
    assert stack.job(job_id)["status"] == "succeeded"
    # the bar's last state: the job, its steps, its epoch and loss, then how it ended
    bar = " ".join(ok.stderr.split())
    steps = stack.job(job_id)["progress"]["total_steps"]
    assert f"{steps}/{steps} epoch 2/2 loss " in bar and f"job {job_id} succeeded: " in bar, bar

    spec = tmp_path / "job.yaml"
    spec.write_text("recipe: tiny\nmax_attempts: 1\nparams:\n  fail: true\n")
    bad = cli(stack, "submit", str(spec), "--follow")
    assert bad.returncode == 1
    assert stack.job(int(bad.stdout.strip()))["status"] == "failed"

    shown = cli(stack, "status", str(job_id), "--json")
    assert shown.returncode == 0 and '"status": "succeeded"' in shown.stdout
    listed = cli(stack, "ls")
    assert listed.returncode == 0 and len(listed.stdout.strip().splitlines()) == 1 + 2
    logs = cli(stack, "logs", str(job_id))
    assert logs.returncode == 0 and "attempt 1 started" in logs.stdout
    again = cli(stack, "cancel", str(job_id))
    assert again.returncode == 1 and "409" in again.stderr


TRAIN_PY = """
import os, sys
import hello_ty, trainyard_job
scale = int(sys.argv[sys.argv.index("--scale") + 1])
rows = open(os.path.join(os.environ["TRAINYARD_INPUT_DIR"], "rows.csv")).read().split()
total = scale * sum(map(int, rows))
print(hello_ty.GREETING, "sum", total)
print("ignored file packed:", os.path.exists("secret.txt"))
print("secrets in env:", sorted(k for k in os.environ if "DATABASE" in k or "TOKEN" in k))
trainyard_job.report(1, epoch=1, total_steps=1, total=total)
with open(os.path.join(os.environ["TRAINYARD_OUTPUT_DIR"], "result.txt"), "w") as f:
    f.write(str(total))
"""


@CLIENT_SIDE
def test_submit_code_packs_uploads_and_runs_a_script(stack: Stack, tmp_path: Path) -> None:
    """`trainyard submit --code DIR --data NAME=FILE -- python train.py ...`: packed
    (ignored files left out), uploaded once, requirements installed from the package's
    requirements.txt (a wheel inside it: no index here), data in place, no secrets."""
    stack.start_worker(env={"TRAINYARD_DATABASE_PASSWORD_HINT": "x"})
    project = tmp_path / "project"
    (project / "wheels").mkdir(parents=True)
    wheel = make_wheel(project / "wheels")
    (project / "train.py").write_text(TRAIN_PY)
    (project / "requirements.txt").write_text(f"--no-index\n./wheels/{wheel.name}\n")
    (project / ".gitignore").write_text("secret.txt\n")
    (project / "secret.txt").write_text("do not ship")
    rows = tmp_path / "rows.csv"
    rows.write_text("1\n2\n3\n")
    command = ["--", "python", "train.py", "--scale", "2"]
    args = ["submit", "--code", str(project), "--data", f"rows.csv={rows}", "--follow"]
    first = cli(stack, *args, *command)
    assert first.returncode == 0, first.stderr
    job_id = int(first.stdout.strip())
    logs = cli(stack, "logs", str(job_id)).stdout
    assert "hello from a requirement sum 12" in logs, logs
    assert "[pip] " in logs  # pip's own output, in the job's log
    assert "ignored file packed: False" in logs and "secrets in env: []" in logs
    assert stack.http.get(f"/jobs/{job_id}/artifacts/output/result.txt").text == "12"
    assert stack.job(job_id)["result"] == {"total": 12.0}

    again = cli(stack, *args, *command)  # the same files: nothing uploaded twice
    assert again.returncode == 0 and again.stderr.count("already uploaded") == 2, again.stderr
    code = stack.job(job_id)["code"]
    listed = cli(stack, "blobs", "ls").stdout
    assert code in listed and f"{job_id}:code" in listed
    done = stack.wait_status(int(again.stdout.strip()), {"succeeded", "failed"})
    assert done["status"] == "succeeded"
    removed = cli(stack, "blobs", "rm", code)
    assert removed.returncode == 0 and f"deleted {code}" in removed.stdout
    assert stack.http.head(f"/blobs/{code}").status_code == 404


@CLIENT_SIDE
def test_submit_code_past_half_the_limit_names_its_largest_files(
    stack: Stack, tmp_path: Path
) -> None:
    """A package past half the server's default limit is still sent, with a warning that
    names what makes it big and how to leave data out of it."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text("print('hi')\n")
    (project / "weights.bin").write_bytes(os.urandom(PACKAGE_WARN_BYTES + 2**20))
    r = cli(stack, "submit", "--code", str(project), "--", "python", "train.py")
    assert r.returncode == 0, r.stderr
    said = " ".join(r.stderr.split())  # rich wraps the line on a narrow stderr
    size = (PACKAGE_WARN_BYTES + 2**20) / 2**20
    assert f"warning: the package of {project} is " in said, said
    assert f"largest files: weights.bin ({size:.1f} MiB), train.py (0.0 MiB)" in said, said
    assert "with .trainyardignore and pass it with --data" in said
    assert stack.job(int(r.stdout))["entrypoint"] == ["python", "train.py"]


@CLIENT_SIDE
def test_submit_code_refuses_a_link_out_of_the_directory(stack: Stack, tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text("")
    (project / "key").symlink_to("/etc/hostname")
    r = cli(stack, "submit", "--code", str(project), "--", "python", "train.py")
    assert r.returncode == 2 and "symbolic link out of the directory" in r.stderr, r.stderr
    assert stack.http.get("/jobs").json()["total"] == 0


@CLIENT_SIDE
def test_cli_reports_a_bad_spec_with_the_field(stack: Stack) -> None:
    stack.start_worker()
    r = cli(stack, "submit", "--recipe", "tiny", "--epochs", "0")
    assert r.returncode == 1 and "epochs" in r.stderr


@CLIENT_SIDE
def test_submit_nodes_on_sqlite_is_refused_naming_nodes(stack: Stack) -> None:
    """--nodes spans boxes, whose workers share PostgreSQL: SQLite's server refuses it
    before the catalog (no worker needed), and the CLI prints the API's reason."""
    r = cli(stack, "submit", "--recipe", "tiny", "--strategy", "ddp", "--nodes", "2")
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "error 422: nodes: " in r.stderr and "PostgreSQL" in r.stderr, r.stderr
    assert r.stdout == "" and stack.http.get("/jobs").json()["total"] == 0


def test_up_serves_once_its_worker_has_registered_and_stops_it_when_stopped(
    tmp_path: Path,
) -> None:
    port = free_port()
    env = stack_env(tmp_path, f"sqlite:///{tmp_path / 'trainyard.db'}", port)
    # a recipe that takes seconds to load: the worker registers well after the API could
    # answer (the worker loads its recipes before it registers)
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "slow.py").write_text("import time\n\ntime.sleep(4)\n")
    env["TRAINYARD_RECIPES_DIR"] = str(tmp_path / "recipes")
    api = httpx.Client(base_url=f"http://127.0.0.1:{port}/api/v1", timeout=5)
    with open(tmp_path / "up.log", "wb") as log:
        up = subprocess.Popen(
            [sys.executable, "-m", "service.cli", "up"],
            env=env,
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    pid = None
    try:

        def first_answer() -> tuple[list[dict[str, object]]] | None:
            try:
                return (api.get("/workers").json(),)  # (an empty list is an answer)
            except httpx.HTTPError:
                return None

        # It serves once its worker has registered: its first answer lists it (a submit
        # naming one of the worker's recipes is never refused as unknown).
        (workers,) = wait_for(first_answer, 90, "the API to answer")
        pid = next((w["pid"] for w in workers if w["alive"]), None)
        assert isinstance(pid, int), workers
        up.send_signal(signal.SIGTERM)  # what systemd or `kill` sends
        assert up.wait(timeout=60) == 128 + signal.SIGTERM, (tmp_path / "up.log").read_text()
        # Its worker went with it (it used to run on, orphaned, after uvicorn's shutdown).
        assert not Path(f"/proc/{pid}").exists(), (tmp_path / "up.log").read_text()
    finally:
        if up.poll() is None:
            up.kill()
        if pid is not None and Path(f"/proc/{pid}").exists():  # orphaned: do not leak it
            os.kill(pid, signal.SIGKILL)
        api.close()


def test_serve_and_worker_refuse_an_unmigrated_database_saying_what_to_run(
    tmp_path: Path,
) -> None:
    """They used to start, and every request answered 503 "try again in
    a few seconds" for ever. They refuse, naming the command; after it, serve starts."""
    env = stack_env(tmp_path, f"sqlite:///{tmp_path / 'trainyard.db'}", free_port())
    for command in ("serve", "worker"):
        r = subprocess.run(
            [sys.executable, "-m", "service.cli", command],
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 1, (command, r.stdout, r.stderr)
        assert "no Trainyard schema yet: run `trainyard migrate`" in r.stderr, (command, r.stderr)

    migrated = subprocess.run(
        [sys.executable, "-m", "service.cli", "migrate"], env=env, cwd=REPO, timeout=60
    )
    assert migrated.returncode == 0
    with running_stack(tmp_path, env["TRAINYARD_DATABASE_URL"]) as stack:
        health = httpx.get(stack.url + "/healthz").json()
        assert health["status"] == "ok" and health["schema"]["revision"] == head_revision()


@CLIENT_SIDE
def test_worker_starts_past_a_broken_recipe_file_and_publishes_why(
    stack: Stack, tmp_path: Path
) -> None:
    """A file that fails to import, or an editor's dot-file, in the
    recipes folder used to stop `trainyard worker` from starting at all."""
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    shutil.copy(RECIPES_DIR / "tiny.py", recipes)
    (recipes / "half_written.py").write_text("from torch import nn\n\ndef model(:\n")
    (recipes / ".#tiny.py").symlink_to("user@box.4242")  # emacs's lock on tiny.py
    stack.start_worker(env={"TRAINYARD_RECIPES_DIR": str(recipes)})
    [worker] = stack.http.get("/workers").json()
    assert worker["recipe_errors"] == [
        {
            "source": str(recipes / "half_written.py"),
            "error": "SyntaxError: invalid syntax (line 3)",
        }
    ]
    assert "tiny" in {r["name"] for r in stack.http.get("/recipes").json()}
    log = (stack.tmp / "worker-e2e.log").read_text()
    assert "skipping recipes from" in log and "half_written.py" in log and ".#tiny" not in log
