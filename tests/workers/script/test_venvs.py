"""Requirements: one virtualenv per requirement set, layered on the worker's packages
(torch is there, never reinstalled), built once and reused; a failed install is its own
reason, with pip's words. Installs a wheel made here, with no package index."""

from __future__ import annotations

import base64
import hashlib
import subprocess
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from service.reasons import ReasonCode
from tests.stack import wait_for
from workers.errors import NotRetryable
from workers.procfs import stat_fields
from workers.script.venvs import python_for
from workers.venv_names import requirement_lines, venv_key


def make_wheel(
    folder: Path,
    name: str = "hello_ty",
    version: str = "0.1",
    greeting: str = "hello from a requirement",
) -> Path:
    """A minimal pure-Python wheel (a module and its metadata), as a build backend makes."""
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}.py": f"GREETING = {greeting!r}\n".encode(),
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n",
    }
    record = "".join(f"{path},sha256={_b64sha(data)},{len(data)}\n" for path, data in files.items())
    record += f"{dist}/RECORD,,\n"
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for name_, data in files.items():
            zf.writestr(name_, data)
        zf.writestr(f"{dist}/RECORD", record)
    return path


def _b64sha(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def test_requirement_lines_default_to_the_package_file(tmp_path: Path) -> None:
    (tmp_path / "requirements.txt").write_text("# tools\nnumpy==2.4.6  # pinned\n\nrich\n")
    assert requirement_lines(None, tmp_path) == ["numpy==2.4.6", "rich"]
    assert requirement_lines(["  six  ", "#x"], tmp_path) == ["six"]
    assert requirement_lines(None, tmp_path / "none") == []


def test_no_requirements_runs_the_workers_own_python(tmp_path: Path) -> None:
    import sys

    assert python_for([], tmp_path, tmp_path, timeout_s=60) == sys.executable


@pytest.mark.slow
def test_a_requirement_installs_once_into_a_layered_virtualenv(tmp_path: Path) -> None:
    package = tmp_path / "package"
    (package / "wheels").mkdir(parents=True)
    wheel = make_wheel(package / "wheels")
    lines = ["--no-index", f"./wheels/{wheel.name}"]
    python = python_for(lines, tmp_path / "cache", package, timeout_s=120)
    probe = "import hello_ty, torch; print(hello_ty.GREETING, torch.__file__)"
    out = subprocess.run([python, "-c", probe], capture_output=True, text=True, check=True)
    greeting, torch_file = out.stdout.rsplit(" ", 1)
    assert greeting == "hello from a requirement"
    assert not torch_file.startswith(str(tmp_path))  # the worker's torch, not a new one
    again = python_for(list(reversed(lines)), tmp_path / "cache", package, timeout_s=120)
    assert again == python  # the same set in another order: the same virtualenv
    assert len(list((tmp_path / "cache" / "venvs").glob("*/.ready"))) == 1


def test_the_key_holds_the_bytes_of_the_package_files_the_lines_name(tmp_path: Path) -> None:
    """Same lines, same wheel bytes: one virtualenv, wherever the package is unpacked.
    Other bytes under the same name, however the line names them: another."""
    wheel = "hello_ty-0.1-py3-none-any.whl"

    def package(name: str, greeting: str) -> Path:
        (tmp_path / name / "wheels").mkdir(parents=True)
        make_wheel(tmp_path / name / "wheels", greeting=greeting)
        (tmp_path / name / "more.txt").write_text(f"--no-index\n./wheels/{wheel}  # nested\n")
        return tmp_path / name

    first, same, changed = package("a", "hi"), package("b", "hi"), package("c", "hello")
    for lines in (
        [f"./wheels/{wheel}"],
        [f"./wheels/{wheel}#egg=hello_ty"],
        [f"./wheels/{wheel}; python_version > '3'"],
        ["--no-index", "--find-links=./wheels", "hello_ty"],
        ["--no-index", "-f./wheels", "hello_ty"],
        ["-r more.txt"],  # and what that file names
    ):
        assert venv_key(lines, first) == venv_key(lines, same), lines
        assert venv_key(lines, first) != venv_key(lines, changed), lines


def test_the_key_holds_where_an_editable_folder_is_and_no_folder_a_project_name_matches(
    tmp_path: Path,
) -> None:
    """``-e .[dev]`` installs a link to the package's folder: another package (another
    folder, named by its digest) gets another virtualenv even with the same bytes. A
    project name is not a path, though a folder in the package has that name; a path
    outside the package, or a word too long to be a name, counts for nothing."""
    for name in ("a", "b"):
        (tmp_path / name / "mypkg").mkdir(parents=True)
        (tmp_path / name / "mypkg" / "__init__.py").write_text("x = 1\n")
    a, b = tmp_path / "a", tmp_path / "b"
    assert venv_key(["-e .[dev]"], a) != venv_key(["-e .[dev]"], b)
    assert venv_key(["-e .[dev]"], a) == venv_key(["-e .[dev]"], a)
    lines = ["mypkg==1.0", "../b/mypkg", "x" * 300]
    before = venv_key(lines, a)
    (tmp_path / "a" / "mypkg" / "__init__.py").write_text("x = 2\n")
    (tmp_path / "b" / "mypkg" / "__init__.py").write_text("x = 2\n")
    assert venv_key(lines, a) == before


@pytest.mark.slow
def test_jobs_asking_for_one_set_at_once_share_one_build(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two jobs start together with the same requirements: one builds under the lock, the
    other waits for it and finds the virtualenv ready (pip ran once)."""
    package = tmp_path / "package"
    (package / "wheels").mkdir(parents=True)
    wheel = make_wheel(package / "wheels")
    lines = ["--no-index", f"./wheels/{wheel.name}"]
    with ThreadPoolExecutor(2) as pool:
        found = list(
            pool.map(lambda _: python_for(lines, tmp_path / "cache", package, timeout_s=120), "ab")
        )
    assert found[0] == found[1]
    assert capsys.readouterr().out.count(f"Processing ./wheels/{wheel.name}") == 1
    probe = [found[0], "-c", "import hello_ty; print(hello_ty.GREETING)"]
    assert subprocess.run(probe, capture_output=True, text=True, check=True).stdout.strip()


@pytest.mark.slow
def test_a_requirements_file_in_the_package_names_another(tmp_path: Path) -> None:
    """``-r more.txt`` is read from the package, as pip reads it beside the file naming it."""
    package = tmp_path / "package"
    (package / "wheels").mkdir(parents=True)
    wheel = make_wheel(package / "wheels", greeting="from a nested file")
    (package / "more.txt").write_text(f"--no-index\n./wheels/{wheel.name}\n")
    python = python_for(["-r more.txt"], tmp_path / "cache", package, timeout_s=120)
    probe = [python, "-c", "import hello_ty; print(hello_ty.GREETING)"]
    out = subprocess.run(probe, capture_output=True, text=True, check=True).stdout
    assert out == "from a nested file\n"


@pytest.mark.slow
def test_a_new_wheel_under_the_same_name_gets_a_new_virtualenv(tmp_path: Path) -> None:
    """The user rebuilt their wheel (same file name, new code) and uploaded a new package:
    the job runs the new code, not the virtualenv that the old wheel made."""
    lines = ["--no-index", "./wheels/hello_ty-0.1-py3-none-any.whl"]
    greetings = []
    for version, greeting in (("old", "hello from the old wheel"), ("new", "hello, rebuilt")):
        (tmp_path / version / "wheels").mkdir(parents=True)
        make_wheel(tmp_path / version / "wheels", greeting=greeting)
        python = python_for(lines, tmp_path / "cache", tmp_path / version, timeout_s=120)
        probe = [python, "-c", "import hello_ty; print(hello_ty.GREETING)"]
        greetings.append(subprocess.run(probe, capture_output=True, text=True, check=True).stdout)
    assert greetings == ["hello from the old wheel\n", "hello, rebuilt\n"]


@pytest.mark.slow
@pytest.mark.timeout(120)  # before the fix, the timeout waited for the backend: an hour
def test_an_install_past_its_timeout_ends_with_every_process_it_started(tmp_path: Path) -> None:
    """A build backend that hangs, two processes below the pip we start (``pip --python``
    runs a second pip, which runs the backend): the timeout ends all of them, and says so."""
    package = tmp_path / "package"
    (package / "hangs").mkdir(parents=True)
    (package / "hangs" / "pyproject.toml").write_text(
        '[build-system]\nrequires = []\nbuild-backend = "hang"\nbackend-path = ["."]\n'
    )
    pid_file = tmp_path / "backend.pid"
    (package / "hangs" / "hang.py").write_text(
        f"import os, time\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\ntime.sleep(3600)\n"
    )
    with pytest.raises(NotRetryable) as failed:
        python_for(["--no-index", "./hangs"], tmp_path / "cache", package, timeout_s=30)
    assert failed.value.code == ReasonCode.requirements_failed
    assert "took longer than 30s (TRAINYARD_REQUIREMENTS_TIMEOUT_S)" in str(failed.value)
    backend = int(pid_file.read_text())
    wait_for(lambda: stat_fields(backend)[:1] in ([], ["Z"]), 10, "the backend to be killed")
    assert not list((tmp_path / "cache" / "venvs").glob("*/.ready"))


@pytest.mark.slow
def test_a_failed_install_is_its_own_reason_with_pips_words(tmp_path: Path) -> None:
    with pytest.raises(NotRetryable) as failed:
        python_for(
            ["--no-index", "no-such-package-trainyard==1.0"],
            tmp_path / "cache",
            tmp_path,
            timeout_s=120,
        )
    assert failed.value.code == ReasonCode.requirements_failed
    assert "No matching distribution" in str(failed.value)
    assert "package index" in str(failed.value)  # the hint for a box without one
    assert not list((tmp_path / "cache" / "venvs").glob("*/bin"))  # nothing half-built kept


SECRET = "the box's own file: never in a job's reason\n"


@pytest.mark.parametrize(
    ("files", "lines", "named"),
    [
        ({}, ["-r {secret}"], "{secret}"),  # the job's own line
        ({"requirements.txt": "--requirement={secret}\n"}, None, "{secret}"),  # its package's
        ({"more.txt": "-c ../../{name}\n"}, ["-r more.txt"], "../../{name}"),  # one it includes
        ({"sub/more.txt": "six\n-r ../../{name}\n"}, ["-r sub/more.txt"], "../../{name}"),
        ({}, ["-r link.txt"], "link.txt"),  # through a link in the package
        ({}, ["-e ./away"], "./away"),  # a folder, through a link
        ({"more.txt": "-r {secret}\n"}, ["--requirem more.txt"], "{secret}"),  # abbreviated
        ({"more.txt": "-r .\\\n./{name}\n"}, ["-r more.txt"], "-r .\\"),  # continued
    ],
)
def test_a_requirement_naming_a_file_outside_the_package_fails_before_pip_runs(
    tmp_path: Path, files: dict[str, str], lines: list[str] | None, named: str
) -> None:
    """pip read any file a line named, and its error put that file's lines into the job's
    reason (``-r /etc/hostname``). The job fails, not retried, naming the line; nothing is
    read from outside the package and no virtualenv is made."""
    secret = tmp_path / "secret.txt"
    secret.write_text(SECRET)
    package = tmp_path / "package"
    package.mkdir()
    (package / "link.txt").symlink_to(secret)
    (package / "away").symlink_to(tmp_path)
    for name, text in files.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(text.format(secret=secret, name=secret.name))
    lines = requirement_lines(
        [line.format(secret=secret) for line in lines] if lines is not None else None, package
    )
    with pytest.raises(NotRetryable) as failed:
        python_for(lines, tmp_path / "cache", package, timeout_s=120)
    assert failed.value.code == ReasonCode.requirements_failed
    message = str(failed.value)
    assert repr(named.format(secret=secret, name=secret.name)) in message
    assert "outside the code package" in message and SECRET.strip() not in message
    assert not (tmp_path / "cache" / "venvs").exists()
