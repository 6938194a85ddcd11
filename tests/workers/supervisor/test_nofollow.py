"""The supervisor in a folder a job owns: a link the job planted is never followed, for a
read, a write, a removal or a change of owner."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from workers.supervisor import nofollow


@pytest.fixture
def planted(tmp_path: Path) -> tuple[Path, Path]:
    """A job's folder whose hand-offs folder holds links to a file of the box's, and a
    folder of the box's in place of a subfolder."""
    box = tmp_path / "box"
    box.mkdir()
    (box / "secret.json").write_text('{"password": "not-for-jobs"}')
    job = tmp_path / "jobs" / "7"
    (job / ".runner").mkdir(parents=True)
    (job / ".runner" / "attempt-1-environment.json").symlink_to(box / "secret.json")
    (job / ".runner" / "metrics-flushed").symlink_to(box / "secret.json")
    (job / ".runner" / f".metrics-flushed.tmp-{os.getpid()}").symlink_to(box / "secret.json")
    (job / "output").symlink_to(box)
    return job, box


def test_a_read_through_a_link_is_refused(planted: tuple[Path, Path]) -> None:
    job, _ = planted
    with pytest.raises(OSError):
        nofollow.read(job, job / ".runner" / "attempt-1-environment.json", 1000)
    with pytest.raises(OSError):  # a link on the way
        nofollow.read(job, job / "output" / "secret.json", 1000)
    assert nofollow.read(job, job / ".runner" / "absent", 1000) is None


def test_a_write_replaces_the_link_and_leaves_its_target_alone(planted: tuple[Path, Path]) -> None:
    job, box = planted
    marker = job / ".runner" / "metrics-flushed"
    nofollow.write(job, marker, b"42")
    assert not marker.is_symlink() and marker.read_text() == "42"
    assert (box / "secret.json").read_text() == '{"password": "not-for-jobs"}'
    with pytest.raises(OSError):
        nofollow.write(job, job / "output" / "planted", b"x")
    assert not (box / "planted").exists()


def test_a_removal_removes_the_link_only(planted: tuple[Path, Path]) -> None:
    job, box = planted
    nofollow.unlink(job, job / ".runner" / "attempt-1-environment.json")
    assert not (job / ".runner" / "attempt-1-environment.json").is_symlink()
    assert (box / "secret.json").is_file()
    assert "attempt-1-environment.json" not in nofollow.listdir(job, job / ".runner")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: it gives files to another account")
def test_a_change_of_owner_never_reaches_past_a_link(planted: tuple[Path, Path]) -> None:
    job, box = planted
    nobody = 65534
    nofollow.chown_tree(job, nobody, nobody)
    assert (job / ".runner").stat().st_uid == nobody
    assert (job / ".runner" / "metrics-flushed").lstat().st_uid == nobody  # the link itself
    assert (box / "secret.json").stat().st_uid == 0 and box.stat().st_uid == 0
    nofollow.chmod_tree(job, lambda mode, folder: 0o777)
    assert (box / "secret.json").stat().st_mode & 0o777 != 0o777


def test_a_fifo_in_place_of_a_hand_off_does_not_block_the_reader(tmp_path: Path) -> None:
    job = tmp_path / "job"
    (job / ".runner").mkdir(parents=True)
    os.mkfifo(job / ".runner" / "attempt-1-points.jsonl")
    with pytest.raises(OSError):  # at once: an open without O_NONBLOCK would wait forever
        nofollow.read(job, job / ".runner" / "attempt-1-points.jsonl", 1000)


def test_the_inputs_folder_is_made_anew_never_through_a_link(
    planted: tuple[Path, Path], tmp_path: Path
) -> None:
    """A job that made its inputs folder a link to a folder of the box's, on an earlier
    attempt: the next attempt's inputs go in a new folder, and the box's is untouched."""
    job, box = planted
    (job / ".inputs").symlink_to(box)
    blob = tmp_path / "blob"
    blob.write_text("data")
    nofollow.place_links(job, job / ".inputs", {"digits.npz": blob})
    assert not (job / ".inputs").is_symlink()
    assert os.readlink(job / ".inputs" / "digits.npz") == str(blob)
    assert sorted(p.name for p in box.iterdir()) == ["secret.json"]
    nofollow.place_links(job, job / ".runner" / "node-1" / "inputs", {"a": blob})
    assert (job / ".runner" / "node-1" / "inputs" / "a").is_symlink()
