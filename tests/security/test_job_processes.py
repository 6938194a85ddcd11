"""A running job as other local users and the network see it, where jobs share the box's network.

Threats: anyone who can reach a port on the box's network interfaces; other local users
(who see every process's command line in ``ps`` and read whatever files their modes
allow); and the job's own code, which is trusted to train but not to hold the worker's
secrets (the API token, the database URL with its password).

- Item 5: while a 2-rank CPU DDP job runs, every socket its processes listen on is bound
  to loopback: the rendezvous store (torch binds it to every interface by default) and
  gloo's sockets (pinned to the loopback interface), for a recipe and for a script.
- Item 6: the job's code finds neither the API token nor the database URL in its
  environment (``os.environ``, or ``/proc/<pid>/environ`` of any of the job's processes),
  nor in the worker's: a process the worker and the API hide is unreadable by the other
  processes of their user.
- Item 8: no process of the job has the lease token on its command line; the job's files
  and folders, the data dir and the SQLite file have no group or other permission bits.
"""

from __future__ import annotations

import ctypes
import ipaddress
import json
import os
import socket
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from service.models import Job
from service.owner_only import PR_SET_DUMPABLE, hide_process
from service.settings import Settings
from tests.e2e.test_script_jobs import script_pids
from tests.scripts import put_package
from tests.stack import REPO, Stack, running_stack, stack_env, wait_for
from workers.env_allowlist import inherited, withheld
from workers.handoff import Handoff
from workers.procfs import group_members
from workers.runner.loopback import loopback_interface
from workers.supervisor.launch import runner_env

PROBE_RECIPES = Path(__file__).with_name("recipes")
PROBE_SCRIPT = Path(__file__).with_name("probe_script")
API_TOKEN = "worker-token-that-jobs-must-not-see-4f9c1d"
TCP_LISTEN = "0A"  # the state column of /proc/net/tcp


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    """A stack on a SQLite file made by ``trainyard migrate``, as an operator makes it."""
    url = f"sqlite:///{tmp_path / 'db' / 'trainyard.db'}"
    env = stack_env(tmp_path, url, port=1)
    subprocess.run([sys.executable, "-m", "service.cli", "migrate"], env=env, cwd=REPO, check=True)
    with running_stack(tmp_path, url) as s:
        yield s


@pytest.mark.slow
@pytest.mark.parametrize("warm_start", [True, False], ids=["forked", "fresh-interpreter"])
def test_a_recipe_ddp_job_listens_on_loopback_and_keeps_its_secrets(
    stack: Stack, tmp_path: Path, warm_start: bool
) -> None:
    # The worker holds the token (workers on other boxes fetch blobs with it). gloo binds
    # the address the hostname resolves to (loopback on this box, not on most): an
    # interface on the network, named the way an operator would, stands in for that.
    env = {"TRAINYARD_API_TOKEN": API_TOKEN, **_gloo_on_the_network()}
    stack.start_worker(env=env, recipes_dir=PROBE_RECIPES, warm_start=warm_start)
    reports, release = tmp_path / "seen", tmp_path / "release"
    reports.mkdir()
    job = stack.submit(
        recipe="probe",
        strategy="ddp",
        devices=2,
        accelerator="cpu",
        epochs=1,
        params={"report_dir": str(reports), "release_file": str(release)},
    )
    seen = wait_for(lambda: _reports(reports, 2), 120, "both ranks to join the group")
    [(token,)] = stack.query("SELECT lease_token FROM job WHERE id = :id", id=job["id"])
    pids = group_members(stack.runner_pgid(job["id"]))
    assert len(pids) >= 3, pids  # the runner and its two ranks

    _assert_loopback_only(pids)
    for pid in pids:
        assert token.encode() not in _proc(pid, "cmdline"), pid
        _assert_no_secret(stack, _proc(pid, "environ").decode(errors="replace"))
    for rank in seen:  # as the recipe's own code reads them
        _assert_no_secret(stack, json.dumps(rank["environ"]) + rank["proc_environ"])
        assert rank["environ"]["GLOO_SOCKET_IFNAME"] == loopback_interface()

    release.touch()
    done = stack.wait_status(job["id"], {"succeeded", "failed"})
    assert done["status"] == "succeeded", done
    job_dir = tmp_path / "data" / "jobs" / str(job["id"])
    assert (job_dir / "model.safetensors").is_file() and (job_dir / "checkpoints").is_dir()
    _assert_private(job_dir)
    _assert_private(tmp_path / "data", recursive=False)
    _assert_private(tmp_path / "db")


@pytest.mark.slow
def test_a_script_ddp_job_listens_on_loopback_only(stack: Stack, tmp_path: Path) -> None:
    stack.start_worker(env={"TRAINYARD_API_TOKEN": API_TOKEN})
    job, release, output = submit_probe_script(stack, tmp_path)
    seen = wait_for(lambda: _reports(output, 2, "rank-*.json"), 120, "both ranks to join")
    ranks = script_pids(stack, job["id"], 1)
    pids = [*group_members(stack.runner_pgid(job["id"])), *ranks]
    assert len(ranks) == 2, ranks

    _assert_loopback_only(pids)
    for rank in seen:
        _assert_no_secret(stack, json.dumps(rank["environ"]))
        assert rank["environ"]["GLOO_SOCKET_IFNAME"] == loopback_interface()

    release.touch()
    done = stack.wait_status(job["id"], {"succeeded", "failed"})
    assert done["status"] == "succeeded", done
    _assert_private(tmp_path / "data" / "jobs" / str(job["id"]))


def submit_probe_script(stack: Stack, tmp_path: Path) -> tuple[dict[str, Any], Path, Path]:
    """A ddp script job of two ranks that each leave a report in its output folder, then
    wait for the release file: the job, the release file, the output folder."""
    release = tmp_path / "release"
    job = stack.submit(
        code=put_package(stack.http, PROBE_SCRIPT, tmp_path),
        entrypoint=["python", "probe.py", str(release)],
        strategy="ddp",
        devices=2,
        accelerator="cpu",
    )
    return job, release, tmp_path / "data" / "jobs" / str(job["id"]) / "output"


def test_a_job_inherits_only_allow_listed_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    worker = {
        "PATH": "/usr/bin",
        "LC_ALL": "C.UTF-8",
        "CUDA_VISIBLE_DEVICES": "0,1",
        "OMP_NUM_THREADS": "4",
        "TRAINYARD_API_TOKEN": API_TOKEN,
        "TRAINYARD_DATABASE_URL": "postgresql+psycopg://trainyard:secret@db/trainyard",
        "AWS_SECRET_ACCESS_KEY": "not-for-jobs",
        "PYTHONPATH": "/srv/trainyard",
    }
    assert inherited(worker) == {
        "PATH": "/usr/bin",
        "LC_ALL": "C.UTF-8",
        "CUDA_VISIBLE_DEVICES": "0,1",
        "OMP_NUM_THREADS": "4",
    }
    for name in list(os.environ):
        monkeypatch.delenv(name)
    for name, value in worker.items():
        monkeypatch.setenv(name, value)
    # The runner also imports the worker's own code, from where the worker does.
    assert runner_env() == {
        **inherited(worker),
        "PYTHONPATH": "/srv/trainyard",
        "PYTORCH_NVML_BASED_CUDA_CHECK": "1",
    }


def test_pip_and_hugging_face_settings_reach_a_job_without_their_credentials() -> None:
    """A worker's HF_TOKEN, or a pip index URL with a password, once reached job code."""
    worker = {
        "PIP_INDEX_URL": "https://ci:hunter2@pypi.example.com/simple",
        "PIP_EXTRA_INDEX_URL": "https://pypi.org/simple",
        "PIP_CLIENT_CERT": "/etc/pip/client.pem",
        "HF_TOKEN": "hf_not_for_jobs",
        "HUGGING_FACE_HUB_TOKEN": "hf_not_for_jobs",
        "HF_HOME": "/cache/hf",
        "HTTPS_PROXY": "http://user:pw@proxy:3128",
    }
    assert inherited(worker) == {
        "PIP_EXTRA_INDEX_URL": "https://pypi.org/simple",
        "HF_HOME": "/cache/hf",
    }
    assert withheld(worker) == ["HTTPS_PROXY", "PIP_INDEX_URL"]  # named in the worker's log


def test_the_runner_hand_off_holds_no_credential(tmp_path: Path) -> None:
    """What a runner is handed (and every process of the job's code could find in its
    memory): the job and the paths and times it needs; never the database URL, the API
    token or the lease token."""
    settings = Settings(
        database_url="postgresql+psycopg://trainyard:secret@db/trainyard",
        data_dir=tmp_path / "data",
        api_token=API_TOKEN,
        lease_s=7.5,
    )
    job = Job(id=7, recipe="tiny", lease_token="lease-token-1", worker_id="w")
    handoff = Handoff.of(job, settings)
    read, write = os.pipe()
    threading.Thread(target=handoff.write, args=(write,)).start()
    with open(read, "rb") as pipe:
        text = pipe.read().decode()
    got = Handoff.model_validate_json(text)
    assert got.the_job().recipe == "tiny" and got.settings.data_dir == (tmp_path / "data")
    for secret in ("secret", API_TOKEN, "lease-token-1", "postgresql"):
        assert secret not in text


def test_files_made_before_are_closed_and_new_ones_are_private(tmp_path: Path) -> None:
    """A data dir and SQLite database from before (0755 and 0644) are closed at start;
    what is made after is the user's alone. (In a process of its own: the umask is the
    whole process's.)"""
    data, database = tmp_path / "data", tmp_path / "trainyard.db"
    data.mkdir(mode=0o755)
    (data / "old.json").write_text("{}")
    for path in (database, tmp_path / "trainyard.db-wal"):
        path.write_bytes(b"")
        path.chmod(0o644)
    data.chmod(0o755)
    start = (
        "import sys; from pathlib import Path; from service.owner_only import keep_private;"
        "from service.settings import Settings;"
        "keep_private(Settings(database_url=sys.argv[1], data_dir=Path(sys.argv[2])));"
        "(Path(sys.argv[2]) / 'jobs' / '1').mkdir(parents=True);"
        "(Path(sys.argv[2]) / 'jobs' / '1' / 'spec.json').write_text('{}')"
    )
    subprocess.run(
        [sys.executable, "-c", start, f"sqlite:///{database}", str(data)],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        check=True,
    )
    _assert_private(data / "jobs")
    _assert_private(data, recursive=False)
    _assert_private(database, recursive=False)
    _assert_private(tmp_path / "trainyard.db-wal", recursive=False)


NOBODY = 65534


@pytest.mark.parametrize("hidden", [True, False], ids=["hidden", "as-before"])
def test_a_hidden_process_environment_is_unreadable_by_its_users_other_processes(
    hidden: bool,
) -> None:
    """What the worker and the API do at start (``hide_process``), seen from a job's
    code, which runs as their user. Both sides are forks of this process; as root they
    become nobody first (root may read any process)."""
    ready_r, ready_w = os.pipe()
    stop_r, stop_w = os.pipe()
    holder = os.fork()
    if holder == 0:  # the worker
        try:
            _as_a_user()
            if hidden:
                hide_process()
            os.write(ready_w, b"r")
            os.read(stop_r, 1)
        finally:
            os._exit(0)
    try:
        os.read(ready_r, 1)
        reader = os.fork()
        if reader == 0:  # a job's code
            code = 1
            try:
                _as_a_user()
                (Path("/proc") / str(holder) / "environ").read_bytes()
                code = 0
            except PermissionError:
                code = 13
            finally:
                os._exit(code)
        read = os.waitstatus_to_exitcode(os.waitpid(reader, 0)[1])
    finally:
        os.write(stop_w, b"s")
        os.waitpid(holder, 0)
        for fd in (ready_r, ready_w, stop_r, stop_w):
            os.close(fd)
    assert read == (13 if hidden else 0)


def _as_a_user() -> None:
    """Root becomes nobody, a process as that user would start (setuid made it not
    dumpable: the kernel's guard for a process that changed its credentials)."""
    if os.geteuid() == 0:
        os.setgid(NOBODY)
        os.setuid(NOBODY)
        ctypes.CDLL(None).prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)


def _gloo_on_the_network() -> dict[str, str]:
    """GLOO_SOCKET_IFNAME naming an interface of this box that is up and not loopback."""
    for _index, name in socket.if_nameindex():
        device = Path("/sys/class/net") / name
        if name != loopback_interface() and (device / "operstate").read_text().strip() == "up":
            return {"GLOO_SOCKET_IFNAME": name}
    return {}


def _reports(folder: Path, count: int, pattern: str = "pid-*.json") -> list[dict[str, Any]]:
    """What the job's processes left in ``folder``, once ``count`` of them have."""
    found = sorted(folder.glob(pattern))
    return [json.loads(p.read_text()) for p in found] if len(found) >= count else []


def _proc(pid: int, name: str) -> bytes:
    return (Path("/proc") / str(pid) / name).read_bytes()


def _assert_no_secret(stack: Stack, text: str) -> None:
    assert API_TOKEN not in text
    assert stack.database_url not in text and "TRAINYARD_DATABASE_URL" not in text


def _assert_loopback_only(pids: list[int]) -> None:
    """Every socket these processes listen on is bound to 127.0.0.1 or ::1 (and the job
    listens on some: its rendezvous store)."""
    found = [(pid, address) for pid in pids for address in listening(pid)]
    assert found, "no process of the job listens: the check would prove nothing"
    exposed = [(pid, str(address)) for pid, address in found if not address.is_loopback]
    assert not exposed, f"listening beyond loopback: {exposed}"


def listening(pid: int) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """The local addresses of the TCP sockets ``pid`` listens on (from /proc)."""
    inodes = set()
    for fd in (Path("/proc") / str(pid) / "fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            inodes.add(target.removeprefix("socket:[").removesuffix("]"))
    addresses: list[ipaddress.IPv4Address | ipaddress.IPv6Address] = []
    for table in ("tcp", "tcp6"):
        lines = (Path("/proc") / str(pid) / "net" / table).read_text().splitlines()[1:]
        for line in lines:
            fields = line.split()
            if fields[3] == TCP_LISTEN and fields[9] in inodes:
                addresses.append(_address(fields[1].split(":")[0]))
    return addresses


def _address(hex_address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """/proc/net/tcp's address: 32-bit words in host (little-endian) order."""
    raw = bytes.fromhex(hex_address)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    address = ipaddress.ip_address(words)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _assert_private(path: Path, *, recursive: bool = True) -> None:
    """``path`` and (``recursive``) everything under it: no bit for group or others."""
    paths = [path, *(path.rglob("*") if recursive else [])]
    shared = [
        f"{p.relative_to(path.parent)} {stat.filemode(mode)}"
        for p in paths
        if not stat.S_ISLNK(mode := p.lstat().st_mode) and mode & 0o077
    ]
    assert not shared, f"readable by others: {shared}"
