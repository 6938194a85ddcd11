"""ObjectStore against a real S3-compatible server (moto on loopback, behind a relay)."""

from __future__ import annotations

import io
import os
import time
from pathlib import Path

import httpx
import pytest

from service.objects.location import Location
from service.objects.store import (
    CHUNK,
    ObjectMissing,
    ObjectStore,
    Stored,
    StoreError,
    StoreUnreachable,
)
from tests.object_store import S3Server

UNREACHABLE_WITHIN_S = 15.0  # connection refused, retried by boto3: a few seconds at most


def test_put_get_size_listing_and_delete(s3: S3Server) -> None:
    store = s3.store()
    store.check()
    store.put_bytes("a/one.txt", b"one")
    store.put_file("a/two.bin", io.BytesIO(b"\x00" * 1000))
    store.put_bytes("b/three.txt", b"three")

    assert store.get_bytes("a/one.txt", limit=100) == b"one"
    assert store.size("a/two.bin") == 1000
    assert store.size("a/none") is None
    assert store.listing("a/") == [Stored("a/one.txt", 3), Stored("a/two.bin", 1000)]
    assert [s.key for s in store.listing("")] == ["a/one.txt", "a/two.bin", "b/three.txt"]

    store.delete(["a/one.txt", "a/never-there"])  # a missing key is no error
    assert [s.key for s in store.listing("")] == ["a/two.bin", "b/three.txt"]
    store.delete([])


def test_keys_live_under_the_prefix_only(s3: S3Server) -> None:
    store = s3.store()
    store.put_bytes("k", b"x")
    prefix = Location.parse(s3.url).prefix
    assert prefix and prefix.endswith("/")
    outside = s3.store(f"s3://{Location.parse(s3.url).bucket}/")
    assert [s.key for s in outside.listing("")] == [f"{prefix}k"]
    other = s3.store(f"{s3.url}other/")
    assert other.listing("") == []
    assert other.size("k") is None


def test_a_put_file_past_the_multipart_threshold_comes_back_whole(
    s3: S3Server, tmp_path: Path
) -> None:
    data = os.urandom(17 * CHUNK)  # past 16 MiB: uploaded in parts
    store = s3.store()
    store.put_file("big", io.BytesIO(data))
    assert store.size("big") == len(data)
    store.download("big", tmp_path / "big", len(data))
    assert (tmp_path / "big").read_bytes() == data


def test_get_bytes_refuses_an_object_past_its_limit(s3: S3Server) -> None:
    store = s3.store()
    store.put_bytes("m.json", b"x" * 101)
    with pytest.raises(Exception, match="101 bytes, past 100") as refused:
        store.get_bytes("m.json", limit=100)
    assert not isinstance(refused.value, ObjectMissing | StoreUnreachable)


def test_download_is_whole_or_nothing(s3: S3Server, tmp_path: Path) -> None:
    store = s3.store()
    data = os.urandom(3000)
    store.put_bytes("w.bin", data)

    store.download("w.bin", tmp_path / "w.bin", 3000)
    assert (tmp_path / "w.bin").read_bytes() == data

    with pytest.raises(Exception, match="3000 bytes, 2999 expected"):
        store.download("w.bin", tmp_path / "short.bin", 2999)
    with pytest.raises(ObjectMissing):
        store.download("nothing", tmp_path / "nothing", 1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w.bin"], "no file, no temp file"


def test_download_over_an_older_file_replaces_it_only_when_whole(
    s3: S3Server, tmp_path: Path
) -> None:
    store = s3.store()
    store.put_bytes("f", b"new")
    target = tmp_path / "f"
    target.write_bytes(b"old")
    with pytest.raises(Exception, match="expected"):
        store.download("f", target, 4)
    assert target.read_bytes() == b"old"
    store.download("f", target, 3)
    assert target.read_bytes() == b"new"


def test_stream_yields_the_bytes_and_the_size(s3: S3Server) -> None:
    store = s3.store()
    data = os.urandom(2 * CHUNK + 5)
    store.put_bytes("s", data)
    pieces, size = store.stream("s")
    got = list(pieces)
    assert size == len(data)
    assert b"".join(got) == data
    assert len(got) >= 3 and all(len(p) <= CHUNK for p in got)
    with pytest.raises(ObjectMissing):
        store.stream("nothing")


def test_a_missing_key_is_object_missing(s3: S3Server) -> None:
    store = s3.store()
    with pytest.raises(ObjectMissing, match="no object 'gone' in the store"):
        store.get_bytes("gone", limit=10)
    assert store.size("gone") is None


def test_a_presigned_url_serves_the_bytes_under_the_filename(s3: S3Server) -> None:
    store = s3.store()
    data = os.urandom(5000)
    store.put_bytes("jobs/1/artifacts/model.pt", data)
    url = store.presign("jobs/1/artifacts/model.pt", filename='job-1 "model".pt', expires_s=60)
    answer = httpx.get(url, timeout=10)
    assert answer.status_code == 200
    assert answer.content == data
    assert answer.headers["content-disposition"] == 'attachment; filename="job-1 model.pt"'


def test_a_stopped_store_is_unreachable_within_seconds_then_back_with_its_objects(
    s3: S3Server,
) -> None:
    store = s3.store(connect_timeout_s=1.0, read_timeout_s=2.0)
    store.put_bytes("kept", b"still here")
    s3.stop()
    for call in (
        lambda: store.get_bytes("kept", limit=100),
        lambda: store.put_bytes("new", b"x"),
        lambda: store.listing(""),
        lambda: store.size("kept"),
        store.check,
    ):
        began = time.monotonic()
        with pytest.raises(StoreUnreachable, match="did not answer"):
            call()
        assert time.monotonic() - began < UNREACHABLE_WITHIN_S
    with pytest.raises(httpx.ConnectError):
        httpx.get(s3.endpoint, timeout=2)  # refused, as a server that is down

    s3.start()
    assert store.get_bytes("kept", limit=100) == b"still here"
    assert [s.key for s in store.listing("")] == ["kept"]


def test_the_default_timeouts_also_fail_fast_on_a_refused_connection(s3: S3Server) -> None:
    store = s3.store()
    s3.stop()
    began = time.monotonic()
    with pytest.raises(StoreUnreachable):
        store.size("k")
    assert time.monotonic() - began < UNREACHABLE_WITHIN_S


def test_a_store_made_in_the_tests_environment_reaches_the_same_bucket(s3: S3Server) -> None:
    """The fixture sets the AWS_ variables: code that makes its own store finds the server."""
    s3.store().put_bytes("shared", b"1")
    assert ObjectStore(s3.url).get_bytes("shared", limit=10) == b"1"


def test_a_missing_bucket_is_refused_not_taken_for_a_missing_object(s3: S3Server) -> None:
    store = s3.store("s3://no-such-bucket-here/")
    with pytest.raises(StoreError, match="no-such-bucket-here") as refused:
        store.check()
    assert type(refused.value) is StoreError
    with pytest.raises(StoreError, match="no bucket") as refused:
        store.get_bytes("k", limit=10)  # the bucket is gone, not the object
    assert type(refused.value) is StoreError


def test_a_stream_cut_midway_is_unreachable(s3: S3Server) -> None:
    store = s3.store(connect_timeout_s=1.0, read_timeout_s=2.0)
    data = os.urandom(12 * CHUNK)  # more than loopback buffers hold: the cut lands midway
    store.put_bytes("s", data)
    pieces, size = store.stream("s")
    got = next(pieces)
    s3.stop()
    with pytest.raises(StoreUnreachable):
        for piece in pieces:
            got += piece
    assert len(got) < size


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("https://bucket/prefix", "a storage URL reads s3://bucket/prefix"),
        ("s3:/bucket/prefix", "a storage URL reads s3://bucket/prefix"),
        ("bucket/prefix", "a storage URL reads s3://bucket/prefix"),
        ("s3://", "is not a bucket name S3 allows"),
        ("s3://Bucket/x", "is not a bucket name S3 allows"),
        ("s3://ab/x", "is not a bucket name S3 allows"),
        ("s3://under_score/x", "is not a bucket name S3 allows"),
        ("s3://a..b/x", "is not a bucket name S3 allows"),
        ("s3://" + "b" * 64 + "/x", "is not a bucket name S3 allows"),
        ("s3://bucket/a/../b", "a storage prefix has no . or .. parts"),
        ("s3://bucket/./b", "a storage prefix has no . or .. parts"),
    ],
)
def test_location_parse_refuses_with_a_clear_message(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        Location.parse(url)


@pytest.mark.parametrize(
    ("url", "bucket", "prefix"),
    [
        ("s3://bucket", "bucket", ""),
        ("s3://bucket/", "bucket", ""),
        ("s3://my.bucket-1/a/b", "my.bucket-1", "a/b/"),
        ("s3://bucket//a//b/", "bucket", "a/b/"),
    ],
)
def test_location_parse_reads_bucket_and_prefix(url: str, bucket: str, prefix: str) -> None:
    location = Location.parse(url)
    assert (location.bucket, location.prefix) == (bucket, prefix)
    assert Location.parse(str(location)) == location
