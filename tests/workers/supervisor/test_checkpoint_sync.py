"""A job's checkpoint folder kept in the object store by the supervisor's CheckpointSync:
real files, a real S3-compatible server (moto, behind a relay that can take it down),
real threads, and a real worker process killed mid-upload."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from service.objects import layout
from service.objects.layout import KEEP_MANIFESTS, Manifest, StoredFile
from service.objects.store import ObjectStore
from tests.object_store import S3Server
from tests.stack import wait_for
from workers import jobfiles
from workers.supervisor import checkpoint_sync
from workers.supervisor.checkpoint_sync import CheckpointSync
from workers.supervisor.launch import runner_env

JOB = 7
INTERVAL_S = 0.2  # the sync's look at the folder: often, so that tests take seconds
UPLOAD_WITHIN_S = 15.0
REPO = Path(__file__).resolve().parents[3]


def make_sync(
    store: ObjectStore,
    root: Path,
    *,
    attempt: int = 1,
    interval_s: float = INTERVAL_S,
    on_trouble: list[str | None] | None = None,
) -> CheckpointSync:
    """A sync of ``root``/checkpoints, as the supervisor makes one per attempt."""
    told = on_trouble if on_trouble is not None else []
    return CheckpointSync(
        store,
        job_id=JOB,
        attempt=attempt,
        node=0,
        root=root,
        folder=root / "checkpoints",
        interval_s=interval_s,
        on_trouble=told.append,
    )


def folder_of(root: Path, files: dict[str, bytes]) -> Path:
    """The job's checkpoint folder holding ``files``, each written whole."""
    folder = root / "checkpoints"
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        jobfiles.write_atomic(folder / name, data)
    return folder


def contents(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def file_objects(store: ObjectStore) -> dict[str, int]:
    """Every checkpoint file version in the store: key to size."""
    return {s.key: s.size for s in store.listing(f"jobs/{JOB}/checkpoints/files/")}


def manifest_keys(store: ObjectStore) -> list[str]:
    return [s.key for s in store.listing(layout.manifests_prefix(JOB))]


def sizes(manifest: Manifest | None) -> dict[str, int]:
    return {} if manifest is None else {f.name: f.size for f in manifest.files}


def newest_names(store: ObjectStore, expected: dict[str, int]) -> Manifest | None:
    """The newest manifest, once it names exactly ``expected`` (names to sizes)."""
    manifest = layout.newest_checkpoint(store, JOB)
    return manifest if sizes(manifest) == expected else None


def publish(store: ObjectStore, files: dict[str, bytes], *, written_at: float) -> Manifest:
    """A checkpoint whole in the store, as another box's sync would have left it."""
    stored = []
    for name, data in files.items():
        key = layout.checkpoint_file_key(JOB, name)
        store.put_bytes(key, data)
        stored.append(StoredFile(name=name, key=key, size=len(data)))
    manifest = Manifest(job_id=JOB, attempt=1, written_at=written_at, files=stored)
    layout.publish_checkpoint(store, manifest)
    return manifest


def age(folder: Path, seconds_ago: float) -> None:
    """Date every file of ``folder`` back, as if written that long ago."""
    then = time.time() - seconds_ago
    for path in folder.rglob("*"):
        os.utime(path, (then, then))


def assert_every_manifest_whole(store: ObjectStore) -> None:
    """No manifest names an object that is missing or shorter than it says."""
    objects = file_objects(store)
    for key in manifest_keys(store):
        manifest = Manifest.model_validate_json(store.get_bytes(key, limit=1 << 20))
        for f in manifest.files:
            assert objects.get(f.key) == f.size, f"{key} names {f.key} ({f.size} bytes)"


# -- upload ---------------------------------------------------------------------------------


def test_each_file_version_goes_up_once_and_old_manifests_are_pruned(
    s3: S3Server, tmp_path: Path
) -> None:
    store = s3.store()
    folder = folder_of(tmp_path, {"a.pt": b"a" * 100, "b.pt": b"b" * 200})
    sync = make_sync(store, tmp_path).start()
    try:
        first = wait_for(
            lambda: newest_names(store, {"a.pt": 100, "b.pt": 200}),
            UPLOAD_WITHIN_S,
            "the first manifest",
        )
        assert len(file_objects(store)) == 2
        assert len(manifest_keys(store)) == 1

        # A newer checkpoint written whole, the oldest pruned by the job: only it goes up.
        jobfiles.write_atomic(folder / "c.pt", b"c" * 300)
        (folder / "a.pt").unlink()
        second = wait_for(
            lambda: newest_names(store, {"b.pt": 200, "c.pt": 300}),
            UPLOAD_WITHIN_S,
            "the manifest of b and c",
        )
        assert second.by_name()["b.pt"].key == first.by_name()["b.pt"].key
        assert len(file_objects(store)) == 3  # a, b (once), c

        jobfiles.write_atomic(folder / "d.pt", b"d" * 400)
        (folder / "b.pt").unlink()
        third = wait_for(
            lambda: newest_names(store, {"c.pt": 300, "d.pt": 400}),
            UPLOAD_WITHIN_S,
            "the manifest of c and d",
        )
        assert third.by_name()["c.pt"].key == second.by_name()["c.pt"].key
    finally:
        sync.flush(timeout_s=10)  # the thread's last upload and prune done
    # The first manifest and a.pt, which only it named, are gone; what is kept is whole.
    assert len(manifest_keys(store)) == KEEP_MANIFESTS
    objects = file_objects(store)
    assert first.by_name()["a.pt"].key not in objects
    assert third.by_name()["c.pt"].key in objects
    assert third.by_name()["d.pt"].key in objects
    assert_every_manifest_whole(store)


# -- restore --------------------------------------------------------------------------------


def test_restore_into_an_empty_folder_downloads_the_newest_checkpoint(
    s3: S3Server, tmp_path: Path
) -> None:
    store = s3.store()
    stored = {"model.pt": os.urandom(5000), "sub/opt.pt": os.urandom(300)}
    publish(store, stored, written_at=time.time())
    folder = folder_of(tmp_path, {})

    said = make_sync(store, tmp_path, attempt=2).restore(always=False)

    assert said is not None and "resuming from the store's newest" in said
    assert contents(folder) == stored
    # no staging left; the note of what was synced (hidden: no artifact)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".checkpoints-synced-node0.json",
        "checkpoints",
    ]


def test_restore_keeps_this_boxs_newer_checkpoint_and_uploads_it(
    s3: S3Server, tmp_path: Path
) -> None:
    store = s3.store()
    publish(store, {"model.pt": b"store" * 10}, written_at=time.time() - 60)
    mine = {"model.pt": b"newer on this box"}
    folder = folder_of(tmp_path, mine)  # written now: after the store's
    before = file_objects(store)

    sync = make_sync(store, tmp_path, attempt=2)
    said = sync.restore(always=False)

    assert said is not None and "newer than the store's" in said
    assert contents(folder) == mine
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoints"]
    assert file_objects(store) == before  # nothing downloaded, nothing sent yet
    sync.start()
    try:
        wait_for(
            lambda: newest_names(store, {"model.pt": len(mine["model.pt"])}),
            UPLOAD_WITHIN_S,
            "this box's checkpoint in the store",
        )
    finally:
        sync.close()


def test_restore_always_takes_the_stores_checkpoint_over_a_newer_one(
    s3: S3Server, tmp_path: Path
) -> None:
    store = s3.store()
    stored = {"model.pt": b"store" * 10}
    publish(store, stored, written_at=time.time() - 60)
    folder = folder_of(tmp_path, {"model.pt": b"newer on this box", "extra.pt": b"x"})

    said = make_sync(store, tmp_path, attempt=2).restore(always=True)

    assert said is not None and "resuming from the store's newest" in said
    assert contents(folder) == stored  # the whole folder is the store's: extra.pt gone


def test_restore_of_the_checkpoint_this_box_synced_downloads_and_uploads_nothing(
    s3: S3Server, tmp_path: Path
) -> None:
    """The job comes back to the box that uploaded the store's newest checkpoint (its
    worker restarted, say): nothing is downloaded, and nothing uploaded again."""
    store = s3.store()
    folder = folder_of(tmp_path, {"model.pt": os.urandom(1000), "opt.pt": os.urandom(10)})
    first = make_sync(store, tmp_path, attempt=1)
    first.restore(always=False)
    first.start()
    assert first.flush(timeout_s=10)
    published = layout.newest_checkpoint(store, JOB)
    assert published is not None
    inodes = {p.name: p.stat().st_ino for p in folder.iterdir()}
    before = {s.key: s.size for s in store.listing("")}

    sync = make_sync(store, tmp_path, attempt=2)
    assert sync.restore(always=True) is None
    assert {p.name: p.stat().st_ino for p in folder.iterdir()} == inodes  # not replaced
    sync.start()
    # Nothing to observe but the absence of an upload: let the thread look a few times.
    time.sleep(INTERVAL_S * 5)
    assert sync.flush(timeout_s=5)

    assert {s.key: s.size for s in store.listing("")} == before
    assert layout.newest_checkpoint(store, JOB) == published


def test_restore_downloads_a_checkpoint_of_the_same_names_and_sizes_it_cannot_vouch_for(
    s3: S3Server, tmp_path: Path
) -> None:
    """Files of the store's names and sizes that this box never synced (no note of them):
    they may be another checkpoint of the same shape; the store's are downloaded."""
    store = s3.store()
    same = {"model.pt": os.urandom(1000)}
    publish(store, same, written_at=time.time())
    folder = folder_of(tmp_path, {"model.pt": os.urandom(1000)})
    age(folder, 3600)

    said = make_sync(store, tmp_path, attempt=2).restore(always=False)

    assert said is not None and "resuming from the store's newest" in said
    assert contents(folder) == same


def test_restore_replaces_an_older_checkpoint_of_the_same_sizes(
    s3: S3Server, tmp_path: Path
) -> None:
    """This box ran the job to an early epoch; another box ran it further and uploaded
    that; the job comes back here. Its checkpoint files have the same names and sizes
    at every epoch (the same tensors): only their bytes tell them apart."""
    store = s3.store()
    folder = folder_of(tmp_path, {"model.pt": b"epoch 3 " * 64})
    age(folder, 3600)  # written an hour before the store's
    later = {"model.pt": b"epoch 8 " * 64}
    publish(store, later, written_at=time.time())

    make_sync(store, tmp_path, attempt=3).restore(always=True)

    assert contents(folder) == later


def test_restore_of_a_manifest_naming_a_missing_object_leaves_the_folder_alone(
    s3: S3Server, tmp_path: Path
) -> None:
    store = s3.store()
    present = layout.checkpoint_file_key(JOB, "model.pt")
    store.put_bytes(present, b"m" * 100)
    manifest = Manifest(
        job_id=JOB,
        attempt=1,
        written_at=time.time(),
        files=[
            StoredFile(name="model.pt", key=present, size=100),
            StoredFile(name="opt.pt", key=layout.checkpoint_file_key(JOB, "opt.pt"), size=50),
        ],
    )
    layout.publish_checkpoint(store, manifest)
    mine = {"model.pt": b"older", "opt.pt": b"older too"}
    folder = folder_of(tmp_path, mine)
    age(folder, 3600)

    # No manifest before it is whole: nothing to restore, the folder left as it was.
    assert make_sync(store, tmp_path, attempt=2).restore(always=False) is None

    assert contents(folder) == mine
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoints"]


def test_restore_on_a_box_that_never_ran_the_job_makes_its_folder(
    s3: S3Server, tmp_path: Path
) -> None:
    store = s3.store()
    stored = {"model.pt": b"weights" * 10}
    publish(store, stored, written_at=time.time())
    root = tmp_path / "jobs" / str(JOB)  # not there yet: nothing of the job ran here

    make_sync(store, root, attempt=2).restore(always=False)

    assert contents(root / "checkpoints") == stored


def test_restore_takes_the_manifest_before_one_whose_objects_are_gone(
    s3: S3Server, tmp_path: Path
) -> None:
    """Another writer pruned the newest manifest's objects meanwhile: the one before is
    whole, and it is what the attempt resumes from."""
    store = s3.store()
    whole = {"model.pt": b"whole" * 20}
    publish(store, whole, written_at=time.time() - 10)
    broken = publish(store, {"model.pt": b"gone" * 20}, written_at=time.time())
    store.delete([f.key for f in broken.files])
    folder = folder_of(tmp_path, {})

    said = make_sync(store, tmp_path, attempt=2).restore(always=True)

    assert said is not None and "resuming from the store's newest" in said
    assert contents(folder) == whole


def test_restore_writes_nothing_through_a_link_the_job_left(s3: S3Server, tmp_path: Path) -> None:
    """The job owns its folder between attempts: links it leaves there under any name the
    restore might use are never written through."""
    store = s3.store()
    stored = {"model.pt": b"weights" * 10}
    publish(store, stored, written_at=time.time())
    root = tmp_path / "job"
    folder = folder_of(root, {})
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for name in (f".checkpoints-restore-{os.getpid()}", f".checkpoints-old-{os.getpid()}"):
        (root / name).symlink_to(elsewhere)

    make_sync(store, root, attempt=2).restore(always=True)

    assert contents(folder) == stored
    assert list(elsewhere.iterdir()) == []


def test_manifests_sort_by_their_sequence_before_the_clock(s3: S3Server, tmp_path: Path) -> None:
    """A job handed back keeps its attempt number; the box that takes it may keep an
    earlier clock. Its manifests still sort after the one it resumed from."""
    store = s3.store()
    ahead = Manifest(job_id=JOB, attempt=1, seq=1, written_at=time.time(), files=[])
    layout.publish_checkpoint(store, ahead)
    folder_of(tmp_path, {})
    sync = make_sync(store, tmp_path, attempt=1)
    sync.restore(always=True)
    assert sync.seq == 1
    (tmp_path / "checkpoints" / "model.pt").write_bytes(b"later")
    sync.start()
    assert sync.flush(timeout_s=10)

    newest = layout.newest_checkpoint(store, JOB)
    assert newest is not None and newest.seq == 2 and newest.by_name().keys() == {"model.pt"}


# -- faults ---------------------------------------------------------------------------------


def failed_store_calls(caplog: pytest.LogCaptureFixture) -> int:
    """Calls boto3 gave up on after its retries (it logs each)."""
    return sum("Max attempts" in r.getMessage() for r in caplog.records)


def test_a_store_down_is_said_once_then_its_return(
    s3: S3Server, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(checkpoint_sync, "RETRY_FIRST_S", 0.1)
    monkeypatch.setattr(checkpoint_sync, "RETRY_MOST_S", 0.2)
    caplog.set_level(logging.DEBUG, logger="botocore.retries.standard")
    store = s3.store(connect_timeout_s=1.0, read_timeout_s=2.0)
    folder = folder_of(tmp_path, {"model.pt": b"1" * 100})
    told: list[str | None] = []
    sync = make_sync(store, tmp_path, on_trouble=told).start()
    try:
        wait_for(lambda: newest_names(store, {"model.pt": 100}), UPLOAD_WITHIN_S, "the first")
        assert told == []

        s3.stop()
        jobfiles.write_atomic(folder / "model.pt", b"2" * 200)
        wait_for(lambda: told, UPLOAD_WITHIN_S, "the trouble said")
        # Several tries fail meanwhile; the trouble is said once, not once per try.
        wait_for(lambda: failed_store_calls(caplog) >= 3, 30, "three failed tries")
        assert len(told) == 1
        assert isinstance(told[0], str) and "did not answer" in told[0]

        s3.start()
        wait_for(lambda: newest_names(store, {"model.pt": 200}), 30, "the upload once back")
        wait_for(lambda: len(told) == 2, UPLOAD_WITHIN_S, "the return said")
        assert told[1] is None
    finally:
        sync.close()


def test_flush_gives_up_at_its_timeout_while_the_store_is_down(
    s3: S3Server, tmp_path: Path
) -> None:
    store = s3.store(connect_timeout_s=1.0, read_timeout_s=2.0)
    folder_of(tmp_path, {"model.pt": b"last" * 100})
    s3.stop()
    sync = make_sync(store, tmp_path, interval_s=3600).start()

    began = time.monotonic()
    assert sync.flush(timeout_s=2) is False
    # One try in progress at the deadline finishes first: boto3's retries of a refused
    # connection, a few seconds at most.
    assert time.monotonic() - began < 8
    assert sync.trouble is not None

    s3.start()
    assert sync.flush(timeout_s=10) is True
    assert sizes(layout.newest_checkpoint(store, JOB)) == {"model.pt": 400}


KILLED_UPLOAD = """
import sys, threading
from pathlib import Path
from service.objects.store import ObjectStore
from workers.supervisor.checkpoint_sync import CheckpointSync

url, job, root = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
sync = CheckpointSync(
    ObjectStore(url), job_id=job, attempt=2, node=0, root=root,
    folder=root / "checkpoints", interval_s=3600, on_trouble=print,
).start()
sys.exit(0 if sync.flush(timeout_s=600) else 1)
"""


def test_a_worker_killed_mid_upload_leaves_the_previous_checkpoint_the_newest(
    s3: S3Server, tmp_path: Path
) -> None:
    store = s3.store()
    folder = folder_of(tmp_path, {"small.pt": b"s" * 100})
    earlier = make_sync(store, tmp_path).start()
    assert earlier.flush(timeout_s=10)
    previous = layout.newest_checkpoint(store, JOB)
    assert sizes(previous) == {"small.pt": 100}

    # 40 MiB: three parts of store.TRANSFER's 16 MiB, uploaded as one multipart upload.
    jobfiles.write_atomic(folder / "big.pt", os.urandom(40 * 1024 * 1024))
    admin = s3.moto.admin  # straight to moto: what it holds, whatever the relay does
    prefix = s3.url.removeprefix(f"s3://{s3.bucket}/") + f"jobs/{JOB}/checkpoints/files/"

    def uploading() -> list[dict[str, str]]:
        answer = admin.list_multipart_uploads(Bucket=s3.bucket, Prefix=prefix)
        return list(answer.get("Uploads", []))

    worker = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(KILLED_UPLOAD), s3.url, str(JOB), str(tmp_path)],
        cwd=REPO,
        env={**os.environ, **s3.env},
    )
    try:
        begun = wait_for(uploading, 30, "the big file's upload to begin", every_s=0.005)
        worker.kill()
        worker.wait(timeout=10)
        assert worker.returncode == -9  # killed, not finished
        # Killed before it could publish: the newest whole checkpoint is the one before.
        assert layout.newest_checkpoint(store, JOB) == previous
        assert len(manifest_keys(store)) == 1
        assert_every_manifest_whole(store)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
        for upload in uploading():  # the killed worker's parts, left in moto's memory
            admin.abort_multipart_upload(
                Bucket=s3.bucket, Key=upload["Key"], UploadId=upload["UploadId"]
            )
    assert begun


def test_an_attempt_ended_before_its_sync_started_starts_no_thread(
    s3: S3Server, tmp_path: Path
) -> None:
    store = s3.store()
    folder_of(tmp_path, {"model.pt": b"m" * 10})
    sync = make_sync(store, tmp_path)

    assert sync.flush(timeout_s=2) is True  # it ended while its checkpoints were restored
    sync.start()
    assert not [t for t in threading.enumerate() if t.name == f"checkpoints-{JOB}"]
    assert sync.flush(timeout_s=2) is True
    assert manifest_keys(store) == []  # it trained nothing: nothing of it goes up


# -- credentials ----------------------------------------------------------------------------

AWS_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "AKIAWORKERSKEY",
    "AWS_SECRET_ACCESS_KEY": "workers-secret",
    "AWS_SESSION_TOKEN": "workers-session",
    "AWS_ENDPOINT_URL": "http://store.internal:9000",
    "AWS_PROFILE": "worker",
}


def test_the_stores_credentials_never_reach_a_job(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in AWS_CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("PATH", "/usr/bin")

    env = runner_env()

    assert env["PATH"] == "/usr/bin"  # the allow-list is at work, not an empty environment
    assert not set(env) & set(AWS_CREDENTIALS)
    assert not [name for name in env if name.startswith("AWS_")]
    assert not [v for v in env.values() if any(s in v for s in AWS_CREDENTIALS.values())]
