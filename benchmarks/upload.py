"""Blob upload throughput against `cp` of the same file on the same disk.

    python -m benchmarks.upload [--mib 1024] [--rounds 4] [--client curl|httpx]

A running API (`trainyard serve`, SQLite) stores a random file of ``--mib`` MiB with
``PUT /api/v1/blobs/sha256:<hex>`` (hashed, counted, fsynced, renamed into place), from
curl as a user would (or httpx), then deletes it; ``cp`` copies the same file into the
same directory tree. They alternate, cp first in even rounds and upload first in odd
ones; the ratio is taken per round (upload MiB/s over cp MiB/s), median over rounds. The
source file stays in the page cache, so neither side waits on reading it. ``cp`` does
not fsync; ``cp + sync`` (``sync FILE`` after it) does, as the upload does: both shown.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks.common import print_table, save
from tests.stack import Stack, running_stack

CHUNK = 16 * 2**20


def make_file(path: Path, mib: int) -> str:
    """A file of random bytes; its digest, as a client computes it before uploading."""
    hasher = hashlib.sha256()
    with open(path, "wb") as out:
        for _ in range(mib * 2**20 // CHUNK):
            block = os.urandom(CHUNK)
            hasher.update(block)
            out.write(block)
        rest = os.urandom(mib * 2**20 % CHUNK)
        hasher.update(rest)
        out.write(rest)
    return "sha256:" + hasher.hexdigest()


def copy(src: Path, dst: Path, sync: bool) -> float:
    start = time.perf_counter()
    subprocess.run(["cp", str(src), str(dst)], check=True)
    if sync:
        subprocess.run(["sync", str(dst)], check=True)
    elapsed = time.perf_counter() - start
    dst.unlink()
    return elapsed


def upload(stack: Stack, src: Path, digest: str, client: str) -> float:
    url = f"{stack.url}/api/v1/blobs/{digest}"
    start = time.perf_counter()
    if client == "curl":
        status = subprocess.run(
            ["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "-T", str(src),
             "-H", "content-type: application/octet-stream", url],
            check=True, capture_output=True, text=True,
        ).stdout  # fmt: skip
    else:
        with open(src, "rb") as body:
            status = str(httpx.put(url, content=body, timeout=600).status_code)
    elapsed = time.perf_counter() - start
    assert status == "201", status
    assert stack.http.delete(f"/blobs/{digest}").status_code == 204
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--client", choices=("curl", "httpx"), default="curl")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, running_stack(Path(tmp)) as stack:
        src = Path(tmp) / "source.bin"
        digest = make_file(src, args.mib)
        dst = Path(tmp) / "data" / "copy.bin"
        dst.parent.mkdir(parents=True, exist_ok=True)
        rows: list[dict[str, Any]] = []
        for round_ in range(args.rounds):
            times: dict[str, float] = {}
            steps = [
                ("cp", lambda: copy(src, dst, sync=False)),
                ("cp_sync", lambda: copy(src, dst, sync=True)),
                ("upload", lambda: upload(stack, src, digest, args.client)),
            ]
            for name, step in steps if round_ % 2 == 0 else steps[::-1]:
                times[name] = step()
            rows.append({
                "round": round_ + 1,
                "cp_mib_s": args.mib / times["cp"],
                "cp_sync_mib_s": args.mib / times["cp_sync"],
                "upload_mib_s": args.mib / times["upload"],
                "vs_cp": times["cp"] / times["upload"],
                "vs_cp_sync": times["cp_sync"] / times["upload"],
            })  # fmt: skip
    summary = {
        "mib": args.mib,
        "client": args.client,
        "rounds": len(rows),
        "vs_cp_median": statistics.median(r["vs_cp"] for r in rows),
        "vs_cp_sync_median": statistics.median(r["vs_cp_sync"] for r in rows),
        "upload_mib_s_median": statistics.median(r["upload_mib_s"] for r in rows),
        "cp_mib_s_median": statistics.median(r["cp_mib_s"] for r in rows),
    }
    print_table(f"blob upload vs cp, {args.mib} MiB, {args.client}", rows)
    print_table("median", [summary])
    save("upload", {"summary": summary, "rounds": rows})


if __name__ == "__main__":
    main()
