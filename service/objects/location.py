"""A storage URL, ``s3://bucket/prefix``, taken apart (settings check it without boto3)."""

from __future__ import annotations

import re
from dataclasses import dataclass

# A bucket name as S3 allows it (3-63 characters: lowercase letters, digits, dots, dashes).
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")


@dataclass(frozen=True)
class Location:
    """``s3://bucket/prefix`` taken apart: every key of Trainyard's starts with ``prefix``."""

    bucket: str
    prefix: str  # "" or "some/folder/"

    @classmethod
    def parse(cls, url: str) -> Location:
        """The bucket and prefix of a storage URL; ValueError saying what is wrong."""
        scheme, sep, rest = url.partition("://")
        if scheme != "s3" or not sep:
            raise ValueError(f"a storage URL reads s3://bucket/prefix, not {url!r}")
        bucket, _, prefix = rest.partition("/")
        if not _BUCKET.fullmatch(bucket) or ".." in bucket:
            raise ValueError(f"{bucket!r} is not a bucket name S3 allows (in {url!r})")
        parts = [p for p in prefix.split("/") if p]
        if any(p in (".", "..") for p in parts):
            raise ValueError(f"a storage prefix has no . or .. parts: {url!r}")
        return cls(bucket, "".join(f"{p}/" for p in parts))

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"
