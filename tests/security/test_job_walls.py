"""The walls around a job, tried as another local account and as a job's own code would
try them: a one-box job's network is its own, and a job running as the job account finds
no credential and cannot write the database (``workers.supervisor.walls``,
``workers.runner.confine``).

The account tests need root, to create a second account and to run the worker as root;
elsewhere they are skipped, saying why.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.scripts import put_package
from tests.security.test_job_processes import listening, submit_probe_script
from tests.stack import REPO, Stack, running_stack, stack_env, wait_for
from tests.workers.script.test_venvs import make_wheel
from workers.procfs import group_members
from workers.supervisor.walls import probe

ACCOUNT = "trainyard-test-job"
HUNTER = Path(__file__).with_name("hunter")
# The worker's token: jobs must find no text holding its marker, anywhere they can look.
TOKEN = "TYWALLS-worker-token-no-job-may-find-7d1e"


def _network_isolation() -> None:
    why = probe()
    if why is not None:
        pytest.skip(f"this box does not allow a network namespace here: {why}")


@pytest.mark.slow
def test_no_process_outside_a_one_box_job_reaches_its_rendezvous_or_gloo_ports(
    tmp_path: Path,
) -> None:
    """A ddp script's elastic agent serves its rendezvous store, and its ranks their gloo
    sockets, in the job's own network: from outside it, every one of those ports refuses
    (the test runs as root, and still cannot connect), and the job's processes are in
    another network namespace than this one."""
    _network_isolation()
    with running_stack(tmp_path) as stack:
        stack.start_worker()
        job, release, output = submit_probe_script(stack, tmp_path)
        wait_for(lambda: len(list(output.glob("rank-*.json"))) == 2, 120, "both ranks to join")
        pids = group_members(stack.runner_pgid(job["id"]))
        ports = {address_port for pid in pids for address_port in _listening_ports(pid)}
        assert ports, "no process of the job listens: the check would prove nothing"
        ours = os.readlink("/proc/self/ns/net")
        assert all(os.readlink(f"/proc/{pid}/ns/net") != ours for pid in pids)
        for port in sorted(ports):
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection(("127.0.0.1", port), timeout=5).close()
        release.touch()
        done = stack.wait_status(job["id"], {"succeeded", "failed"})
        assert done["status"] == "succeeded", done
        [workers] = [w for w in stack.http.get("/workers").json() if w["id"] == "e2e"]
        assert workers["job_walls"]["job_network"] == "isolated"


def _listening_ports(pid: int) -> list[int]:
    """The TCP ports ``pid`` listens on, as its own network sees them."""
    ports = []
    for table in ("tcp", "tcp6"):
        for line in (Path("/proc") / str(pid) / "net" / table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A":  # LISTEN
                ports.append(int(fields[1].split(":")[1], 16))
    return ports if listening(pid) else []


@pytest.fixture(scope="module")
def job_account() -> str:
    """A second account for the jobs, created once (as CI's machine keeps it)."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the worker starts jobs as a second account it switches to")
    if subprocess.run(["id", ACCOUNT], capture_output=True).returncode != 0:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--home-dir", "/nonexistent",
             "--shell", "/usr/sbin/nologin", ACCOUNT],
            check=True,
        )  # fmt: skip
    runs = subprocess.run(
        [sys.executable, "-c", "import workers.runner.main"],
        user=ACCOUNT,
        cwd="/",
        env={"PYTHONPATH": str(REPO), "PATH": os.environ["PATH"]},
        capture_output=True,
        text=True,
    )
    if runs.returncode != 0:
        why = (runs.stderr.strip().splitlines() or ["?"])[-1]
        pytest.skip(f"{ACCOUNT} cannot run this interpreter ({why}): .ci/run opens /root")
    return ACCOUNT


@pytest.fixture
def open_tmp() -> Iterator[Path]:
    """A folder the job account can pass through (pytest's own is its user's alone)."""
    folder = Path(tempfile.mkdtemp(prefix="trainyard-walls-", dir="/tmp"))
    folder.chmod(0o711)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def walled(job_account: str, open_tmp: Path) -> Iterator[Stack]:
    """A stack on SQLite whose worker runs as root, holds a token, and runs jobs as the
    job account."""
    url = f"sqlite:///{open_tmp / 'trainyard.db'}"
    env = stack_env(open_tmp, url, port=1, job_user=job_account)
    subprocess.run([sys.executable, "-m", "service.cli", "migrate"], env=env, cwd=REPO, check=True)
    with running_stack(open_tmp, url, job_user=job_account) as stack:
        stack.start_worker(env={"TRAINYARD_API_TOKEN": TOKEN})
        yield stack


@pytest.mark.slow
def test_jobs_of_every_kind_find_no_credential_and_cannot_write_the_database(
    walled: Stack, open_tmp: Path
) -> None:
    """A script, a package's recipes and a requirement's build backend each search every
    place a credential could be, and try to make their owner an admin: they find nothing,
    read nothing of the worker's, and change nothing."""
    stack, data = walled, open_tmp / "data"
    package = open_tmp / "hunter"
    shutil.copytree(HUNTER, package)
    make_wheel(package)  # an earlier job's virtualenv, which no later job may change
    code = put_package(stack.http, package, open_tmp)
    first = stack.submit(
        code=code,
        entrypoint=["python", "-c", "import hello_ty"],
        requirements=["./hello_ty-0.1-py3-none-any.whl"],
    )
    assert stack.wait_status(first["id"], {"succeeded", "failed"})["status"] == "succeeded"
    other = data / "jobs" / str(first["id"])
    database = open_tmp / "trainyard.db"
    jobs = {
        "script": stack.submit(
            code=code,
            entrypoint=["python", "hunt.py", str(data), str(database), str(other)],
            requirements=[],
        ),
        "recipe": stack.submit(code=code, recipe="anything"),
        "build backend": stack.submit(
            code=code, entrypoint=["python", "hunt.py"], requirements=["./builds"]
        ),
    }
    admins_before = stack.query("SELECT name, admin FROM trainyard_user ORDER BY name")
    for kind, job in jobs.items():
        stack.wait_status(job["id"], {"succeeded", "failed"})
        found = _hunt(stack, job["id"])
        assert found["uid"] != 0, (kind, found)
        assert found["env"] == [] and found["procs"] == [], (kind, found)
        assert found["objects"] == [], (kind, found)
        assert not found["listed_data_dir"] and found["read"] == [], (kind, found)
        assert found["db_write"].startswith("refused"), (kind, found)
        assert found["venv_writes"] == [], (kind, found)
    assert stack.query("SELECT name, admin FROM trainyard_user ORDER BY name") == admins_before
    [worker] = [w for w in stack.http.get("/workers").json() if w["id"] == "e2e"]
    assert worker["job_walls"]["runs_jobs_as"] == ACCOUNT


def _hunt(stack: Stack, job_id: int) -> dict[str, Any]:
    lines = stack.http.get(f"/jobs/{job_id}/logs", params={"limit": 10000}).json()
    texts = [line["text"] for line in lines]
    for text in texts:
        if "HUNT {" in text:
            return dict(json.loads(text.split("HUNT ", 1)[1]))
    raise AssertionError(f"job {job_id} left no HUNT line: {texts[-20:]}")


WAITER = (
    "import os, pathlib, time\n"
    "out = pathlib.Path(os.environ['TRAINYARD_OUTPUT_DIR'])\n"
    "(out / 'uid').write_text(str(os.getuid()))\n"
    "deadline = time.monotonic() + 120\n"
    "while not (out / 'release').exists() and time.monotonic() < deadline:\n"
    "    time.sleep(0.05)\n"
)


@pytest.mark.slow
def test_attempts_running_at_once_run_as_uids_of_their_own(
    job_account: str, open_tmp: Path
) -> None:
    """With TRAINYARD_JOB_UIDS, a job cannot read the folder, environment or memory of
    another job running beside it: each attempt has a uid of its own."""
    url = f"sqlite:///{open_tmp / 'trainyard.db'}"
    walls = {"job_user": job_account, "job_uids": "230000-230007"}
    env = stack_env(open_tmp, url, port=1, **walls)
    subprocess.run([sys.executable, "-m", "service.cli", "migrate"], env=env, cwd=REPO, check=True)
    with running_stack(open_tmp, url, **walls) as stack:
        stack.start_worker(env={"TRAINYARD_API_TOKEN": TOKEN})
        code = put_package(stack.http, HUNTER, open_tmp)
        data = open_tmp / "data"
        beside = stack.submit(code=code, entrypoint=["python", "-c", WAITER], requirements=[])
        output = data / "jobs" / str(beside["id"]) / "output"
        uid = int(
            wait_for(
                lambda: (output / "uid").is_file() and (output / "uid").read_text(), 60, "a uid"
            )
        )
        hunter = stack.submit(
            code=code,
            entrypoint=[
                "python",
                "hunt.py",
                str(data),
                str(open_tmp / "trainyard.db"),
                str(output.parent),
            ],
            requirements=[],
        )
        stack.wait_status(hunter["id"], {"succeeded", "failed"})
        found = _hunt(stack, hunter["id"])
        (output / "release").touch()
        assert stack.wait_status(beside["id"], {"succeeded", "failed"})["status"] == "succeeded"
    assert 230000 <= uid <= 230007 and 230000 <= found["uid"] <= 230007 and found["uid"] != uid
    assert found["read"] == [] and found["procs"] == [], found
