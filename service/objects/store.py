"""The object store (S3, or an S3-compatible server: MinIO, Ceph): the one module that
talks to it, through boto3.

``TRAINYARD_STORAGE_URL=s3://bucket/prefix`` names where; everything else is boto3's, the
usual AWS ways: ``AWS_ENDPOINT_URL`` for a server that is not AWS, ``AWS_ACCESS_KEY_ID``
and ``AWS_SECRET_ACCESS_KEY``, a profile, an instance role. Only the API and the worker's
supervisor make a store: a job's processes never see its credentials (their environment
is an allow-list without ``AWS_``) nor reach it (a job's own network is loopback only).

Each call is bounded: a store that does not answer fails it within seconds as
``StoreUnreachable``, which callers wait out (uploads) or report (reads).
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import botocore.exceptions

from service.errors import TrainyardError
from service.objects.location import Location

log = logging.getLogger(__name__)

CHUNK = 1024 * 1024  # a streamed object's pieces


@functools.cache
def transfer_config() -> Any:
    """Transfers: parts of 16 MiB, 8 at once (boto3's defaults are 8 MiB and 10): a 1 GiB
    checkpoint is 64 parts, each retried on its own. (boto3 is imported where a store is
    made, not with this module: ~0.4 s an API or worker without one need not spend.)"""
    from boto3.s3.transfer import TransferConfig

    return TransferConfig(
        multipart_threshold=16 * CHUNK, multipart_chunksize=16 * CHUNK, max_concurrency=8
    )


def __getattr__(name: str) -> Any:
    if name == "TRANSFER":  # the transfer settings, for benchmarks and tests to compare
        return transfer_config()
    raise AttributeError(name)


class StoreError(TrainyardError):
    """The object store refused a request (credentials, a missing bucket, a bad URL)."""


class StoreUnreachable(StoreError):
    """The object store did not answer, or answered with a server error, after retries."""


class ObjectMissing(StoreError):
    """No object under that key."""


@dataclass(frozen=True)
class Stored:
    """An object's key (below the prefix) and size."""

    key: str
    size: int


class ObjectStore:
    """One bucket and prefix; keys passed in and out are relative to the prefix. Safe to
    share between threads (boto3's clients are)."""

    def __init__(
        self, url: str, *, connect_timeout_s: float = 5.0, read_timeout_s: float = 60.0
    ) -> None:
        import boto3
        from botocore.config import Config

        self.location = Location.parse(url)
        config = Config(
            connect_timeout=connect_timeout_s,
            read_timeout=read_timeout_s,
            retries={"mode": "standard", "max_attempts": 3},
            max_pool_connections=16,
            signature_version="s3v4",  # presigned links too: newer regions refuse SigV2
            # S3-compatible servers (MinIO, Ceph, moto) answer at their endpoint's own
            # name; a bucket's subdomain of it resolves nowhere.
            s3={"addressing_style": "path"} if _custom_endpoint() else {},
        )
        self.client: Any = boto3.session.Session().client("s3", config=config)

    def __repr__(self) -> str:
        return f"ObjectStore({self.location})"

    def _key(self, key: str) -> str:
        return self.location.prefix + key

    def put_file(self, key: str, file: IO[bytes]) -> None:
        """Upload an open file from where it is read now (parts in parallel when large);
        the object appears whole once the upload completes, never in part."""
        with _errors(key):
            self.client.upload_fileobj(
                file, self.location.bucket, self._key(key), Config=transfer_config()
            )

    def put_bytes(self, key: str, data: bytes) -> None:
        with _errors(key):
            self.client.put_object(Bucket=self.location.bucket, Key=self._key(key), Body=data)

    def get_bytes(self, key: str, *, limit: int) -> bytes:
        """A small object whole (a manifest); ``StoreError`` past ``limit`` bytes."""
        with _errors(key):
            answer = self.client.get_object(Bucket=self.location.bucket, Key=self._key(key))
            if answer["ContentLength"] > limit:
                answer["Body"].close()
                raise StoreError(f"{key} holds {answer['ContentLength']} bytes, past {limit}")
            data: bytes = answer["Body"].read()
            return data

    def download(self, key: str, path: Path, size: int) -> None:
        """The object into ``path``, whole or not at all: into a temp file beside it, its
        size checked, then renamed."""
        tmp = path.with_name(f".{path.name}.download-{os.getpid()}-{threading.get_ident()}")
        try:
            with _errors(key):
                self.client.download_file(
                    self.location.bucket, self._key(key), str(tmp), Config=transfer_config()
                )
            got = tmp.stat().st_size
            if got != size:
                raise StoreError(f"{key} holds {got} bytes, {size} expected")
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)

    def stream(self, key: str) -> tuple[Iterator[bytes], int]:
        """The object's bytes in pieces, and its size; the body is closed once read."""
        with _errors(key):
            answer = self.client.get_object(Bucket=self.location.bucket, Key=self._key(key))
        body = answer["Body"]

        def pieces() -> Iterator[bytes]:
            try:
                with _errors(key):
                    yield from body.iter_chunks(CHUNK)
            finally:
                body.close()

        return pieces(), int(answer["ContentLength"])

    def size(self, key: str) -> int | None:
        """The object's size, or None when there is none."""
        try:
            with _errors(key):
                answer = self.client.head_object(Bucket=self.location.bucket, Key=self._key(key))
        except ObjectMissing:
            return None
        return int(answer["ContentLength"])

    def listing(self, prefix: str) -> list[Stored]:
        """Every object whose key starts with ``prefix``, by key."""
        found = []
        with _errors(prefix):
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.location.bucket, Prefix=self._key(prefix)
            )
            for page in pages:
                for item in page.get("Contents", []):
                    key = item["Key"][len(self.location.prefix) :]
                    found.append(Stored(key, int(item["Size"])))
        return sorted(found, key=lambda s: s.key)

    def delete(self, keys: list[str]) -> None:
        """Remove these objects (missing ones are no error)."""
        for start in range(0, len(keys), 1000):  # S3's most per request
            batch = [{"Key": self._key(k)} for k in keys[start : start + 1000]]
            with _errors(keys[start]):
                answer = self.client.delete_objects(
                    Bucket=self.location.bucket, Delete={"Objects": batch, "Quiet": True}
                )
            refused = answer.get("Errors") or []  # S3 answers 200 and lists what it kept
            if refused:
                first = refused[0]
                raise StoreError(
                    f"the object store kept {len(refused)} objects it was asked to delete: "
                    f"{first.get('Key')}: {first.get('Code')} {first.get('Message')}"
                )

    def presign(self, key: str, *, filename: str, expires_s: int) -> str:
        """A URL anyone holding it may GET the object at for ``expires_s`` seconds, saved
        as ``filename``."""
        quoted = filename.replace('"', "")
        disposition = f'attachment; filename="{quoted}"'
        with _errors(key):
            url: str = self.client.generate_presigned_url(
                "get_object",
                Params={
                    "Bucket": self.location.bucket,
                    "Key": self._key(key),
                    "ResponseContentDisposition": disposition,
                },
                ExpiresIn=expires_s,
            )
        return url

    def check(self) -> None:
        """Fail now, saying why, if the bucket cannot be reached or read (at start)."""
        try:
            with _errors(""):
                self.client.head_bucket(Bucket=self.location.bucket)
        except ObjectMissing as exc:  # HEAD's 404 carries no code to tell a bucket by
            raise StoreError(f"the object store has no bucket {self.location.bucket}") from exc


def _boto3_transfer_error(exc: BaseException) -> bool:
    """boto3's own errors of a transfer (``RetriesExceededError`` when a download's
    connection keeps dropping, ``S3UploadFailedError``), which are not botocore's."""
    import boto3.exceptions  # loaded already: a store was made to get here

    return isinstance(exc, boto3.exceptions.Boto3Error)


def _custom_endpoint() -> bool:
    return bool(os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT_URL_S3"))


class _errors:
    """botocore's exceptions as this module's: unreachable, missing, or refused."""

    def __init__(self, key: str) -> None:
        self.key = key

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        if exc is None or isinstance(exc, StoreError):
            return
        if isinstance(exc, botocore.exceptions.ClientError):
            error = exc.response.get("Error", {})
            status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))
            if error.get("Code") == "NoSuchBucket":
                raise StoreError(
                    f"the object store has no bucket {error.get('BucketName')}"
                ) from exc
            if status == 404 or error.get("Code") in ("NoSuchKey", "404", "NotFound"):
                raise ObjectMissing(f"no object {self.key!r} in the store") from exc
            if status >= 500:
                message = error.get("Message") or exc
                raise StoreUnreachable(f"the object store failed: {message}") from exc
            raise StoreError(f"the object store refused {self.key!r}: {exc}") from exc
        if _boto3_transfer_error(exc):  # a transfer's retries used up: the connection
            raise StoreUnreachable(f"the object store did not answer: {exc}") from exc
        if isinstance(exc, botocore.exceptions.NoCredentialsError):
            raise StoreError(
                "no credentials for the object store: set AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY, a profile (AWS_PROFILE), or give the box a role"
            ) from exc
        if isinstance(exc, botocore.exceptions.BotoCoreError | ConnectionError | TimeoutError):
            raise StoreUnreachable(f"the object store did not answer: {exc}") from exc
