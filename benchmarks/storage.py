"""The object store's costs, side by side in one run against a real S3 server on loopback
(moto, ``tests.object_store.MotoProcess``):

    python -m benchmarks.storage [--rounds 3] [--seconds 25] [--gib 1] [--only train,download]

1. *Training with its checkpoints going to the store, against local only.* The ``tiny``
   recipe (``single``, one CPU thread, a checkpoint every epoch of ~1 s) trains in a
   child process, as a runner trains apart from the supervisor; in this process, as the
   supervisor does, a ``CheckpointSync`` (``interval_s`` 1.0) uploads its checkpoint
   folder to moto while it trains (B), or nothing watches the folder (A). A and B take
   turns, the first of each round alternating; samples/s is the child's own (its epochs'
   samples over the time ``strategies.run`` took), the ratio B/A per round, its median
   reported. Beside them: each upload's wall time and bytes (timed around the sync's own
   upload), the CPU this process and moto spent meanwhile.
2. *A large checkpoint's download.* One object of ``--gib`` GiB of random bytes, uploaded
   once; then, in turns (the order alternating), ``ObjectStore.download`` against boto3's
   own ``download_file`` of the same object from a plain client (boto3's defaults), each
   into a new file on this disk, and ``ObjectStore.stream`` (how the API serves an
   artifact) read to the end and dropped; beside them, like for like, boto3's
   ``download_file`` with ObjectStore's transfer settings (its parts: 16 MiB, 8 at once,
   against boto3's 8 MiB, 10). Throughputs per round; the ratio ObjectStore/boto3 per
   round, its median reported.

Moto is a Python server on the same two cores: what it spends answering (from
``/proc``) a real S3 spends elsewhere, so the figures are what this box can show, not
what a store across the network costs.
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing as mp
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import boto3

from benchmarks.common import print_table, save
from service.objects.store import TRANSFER, ObjectStore
from tests.object_store import ACCESS_KEY_ID, REGION, SECRET_ACCESS_KEY, moto_process
from tests.stack import RECIPES_DIR
from workers.jobfiles import CHECKPOINTS
from workers.supervisor.checkpoint_sync import CheckpointSync, Snapshot

BUCKET = "trainyard-bench"
PARAMS = {"samples": 16384, "width": 8}  # ~1 s an epoch here: a checkpoint every ~1 s
BATCH = 16
SYNC_INTERVAL_S = 1.0
TRAIN_GOAL = 0.98  # samples/s with the store over local only, at least
DOWNLOAD_GOAL = 0.9  # ObjectStore.download's throughput over boto3's, at least
MIB = 1024 * 1024
_JOB_IDS = itertools.count(1)  # each run its own job in the bucket


# -- 1. training ----------------------------------------------------------------------------


def _train(job_dir: str, epochs: int, out: Any) -> None:
    """The child: train ``epochs`` of ``tiny``, checkpointing each; report its speed."""
    from service.models import Accelerator, Optimizer, Precision, Strategy
    from workers.ranks import strategies  # torch in the child only
    from workers.ranks.training import RunSpec

    spec = RunSpec(
        job_id=1, recipe="tiny", params=PARAMS, strategy=Strategy.single,
        accelerator=Accelerator.cpu, devices=1, epochs=epochs, batch_size=BATCH, lr=1e-3,
        optimizer=Optimizer.adamw, seed=0, precision=Precision.fp32, checkpoint_every=1,
        job_dir=job_dir, recipes_dir=str(RECIPES_DIR), threads=1,
    )  # fmt: skip
    start = time.perf_counter()
    strategies.run(spec)
    wall = time.perf_counter() - start
    out.put({"samples_per_s": epochs * PARAMS["samples"] / wall, "wall_s": wall})


class TimedSync(CheckpointSync):
    """The supervisor's sync, each upload's wall time and new bytes noted."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.uploads: list[tuple[float, int]] = []

    def _upload(self, snapshot: Snapshot) -> bool:
        new = sum(v.size for v in snapshot.values() if v not in self.synced.keys)
        start = time.perf_counter()
        ok = super()._upload(snapshot)
        self.uploads.append((time.perf_counter() - start, new))
        return ok


def _cpu_s(pid: int) -> float:
    """A process's CPU time so far (user + system, its waited-for children included)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = sum(int(f) for f in fields[11:15])  # utime stime cutime cstime
    return ticks / os.sysconf("SC_CLK_TCK")


def train_once(
    tmp: Path, tag: str, epochs: int, store: ObjectStore | None, moto_pid: int
) -> dict[str, Any]:
    """One run: the child trains; with ``store``, a sync uploads its checkpoints meanwhile."""
    ctx = mp.get_context("spawn")
    root = tmp / tag
    root.mkdir()
    sync: TimedSync | None = None
    if store is not None:
        sync = TimedSync(
            store, job_id=next(_JOB_IDS), attempt=1, node=0, root=root,
            folder=root / CHECKPOINTS, interval_s=SYNC_INTERVAL_S, on_trouble=_trouble,
        )  # fmt: skip
        sync.start()
    out = ctx.Queue()
    child = ctx.Process(target=_train, args=(str(root), epochs, out))
    cpu, moto_cpu = time.process_time(), _cpu_s(moto_pid)
    child.start()
    result: dict[str, Any] = out.get(timeout=600)
    child.join()
    result["this_process_cpu_s"] = time.process_time() - cpu
    result["moto_cpu_s"] = _cpu_s(moto_pid) - moto_cpu
    if sync is not None:
        assert sync.flush(timeout_s=60), "the last checkpoint did not reach the store"
        ok = [u for u in sync.uploads if u[1] > 0]
        result["uploads"] = len(ok)
        result["upload_ms_median"] = statistics.median(u[0] for u in ok) * 1000
        result["upload_ms_max"] = max(u[0] for u in ok) * 1000
        result["upload_kib_median"] = statistics.median(u[1] for u in ok) / 1024
    return result


def _trouble(why: str | None) -> None:
    if why is not None:
        raise RuntimeError(f"the store failed during the benchmark: {why}")


def measure_training(
    tmp: Path, store: ObjectStore, moto_pid: int, rounds: int, seconds: float
) -> dict[str, Any]:
    """A and B in turns; per-side medians and the median of the rounds' ratios."""
    warm = train_once(tmp, "warm", 3, None, moto_pid)  # also times an epoch
    epochs = max(3, round(seconds / (PARAMS["samples"] / warm["samples_per_s"])))
    local: list[dict[str, Any]] = []
    synced: list[dict[str, Any]] = []
    for r in range(rounds):
        sides: list[tuple[str, ObjectStore | None, list[dict[str, Any]]]] = [
            ("local", None, local),
            ("store", store, synced),
        ]
        for name, side_store, results in sides if r % 2 == 0 else reversed(sides):
            results.append(train_once(tmp, f"{name}{r}", epochs, side_store, moto_pid))
    ratios = sorted(
        s["samples_per_s"] / a["samples_per_s"] for s, a in zip(synced, local, strict=True)
    )
    rows = []
    for name, results in (("local only", local), ("to the store", synced)):
        row: dict[str, Any] = {"checkpoints": name}
        for key in results[0]:
            row[key] = statistics.median(r[key] for r in results)
        rows.append(row)
    return {
        "epochs": epochs,
        "epoch_s": warm["wall_s"] / 3,
        "rounds": rounds,
        "rows": rows,
        "ratio": statistics.median(ratios),
        "ratios": ratios,
        "local": local,
        "store": synced,
    }


# -- 2. download ----------------------------------------------------------------------------


def _random_file(path: Path, size: int) -> None:
    with path.open("wb") as f:
        for _ in range(size // (64 * MIB)):
            f.write(os.urandom(64 * MIB))


def measure_download(
    tmp: Path, store: ObjectStore, endpoint: str, rounds: int, gib: float
) -> dict[str, Any]:
    """ObjectStore.download against boto3's download_file, and stream, in turns."""
    size = int(gib * 1024) * MIB
    source = tmp / "big.bin"
    _random_file(source, size)
    key = "bench/big.bin"
    start = time.perf_counter()
    with source.open("rb") as f:
        store.put_file(key, f)
    upload_s = time.perf_counter() - start
    source.unlink()
    plain: Any = boto3.session.Session().client("s3", endpoint_url=endpoint)
    full_key = store.location.prefix + key

    def ours() -> None:
        target = tmp / "ours.bin"
        store.download(key, target, size)
        target.unlink()

    def boto3s() -> None:
        target = tmp / "boto3.bin"
        plain.download_file(store.location.bucket, full_key, str(target))
        assert target.stat().st_size == size
        target.unlink()

    def boto3s_parts() -> None:  # like for like: ObjectStore's parts, none of its checks
        target = tmp / "boto3-parts.bin"
        plain.download_file(store.location.bucket, full_key, str(target), Config=TRANSFER)
        target.unlink()

    def streamed() -> None:
        pieces, length = store.stream(key)
        got = sum(len(p) for p in pieces)
        assert got == length == size

    sides = [("ObjectStore.download", ours), ("boto3 download_file", boto3s)]
    sides += [("boto3, ObjectStore's parts", boto3s_parts), ("ObjectStore.stream", streamed)]
    speeds: dict[str, list[float]] = {name: [] for name, _ in sides}
    for r in range(rounds):
        order = sides if r % 2 == 0 else list(reversed(sides))
        for name, call in order:
            start = time.perf_counter()
            call()
            speeds[name].append(size / MIB / (time.perf_counter() - start))

    def ratios_to(other: str) -> list[float]:
        ours = speeds["ObjectStore.download"]
        return sorted(o / b for o, b in zip(ours, speeds[other], strict=True))

    ratios = ratios_to("boto3 download_file")
    same_parts = ratios_to("boto3, ObjectStore's parts")
    rows = [
        {"how": name, "MiB_per_s_median": statistics.median(v), "min": min(v), "max": max(v)}
        for name, v in speeds.items()
    ]
    plain.close()
    return {
        "size_mib": size // MIB,
        "upload_s": upload_s,
        "rounds": rounds,
        "rows": rows,
        "ratio": statistics.median(ratios),
        "ratios": ratios,
        "ratio_same_parts": statistics.median(same_parts),
        "ratios_same_parts": same_parts,
    }


# -- the run --------------------------------------------------------------------------------


def say_ratio(what: str, ratio: float, rounds: list[float], goal: float) -> None:
    verdict = "met" if ratio >= goal else "missed"
    each = ", ".join(f"{r:.3f}" for r in rounds)
    print(f"\n{what}: {ratio:.3f}x (rounds {each}); goal >= {goal}x: {verdict}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3, help="turns of each side")
    parser.add_argument("--seconds", type=float, default=25.0, help="a training run's length")
    # 1 GiB is the goal's size, but moto reads a whole object for each ranged GET: a
    # 1 GiB multipart download takes many minutes there (see benchmarks/README.md)
    parser.add_argument("--gib", type=float, default=0.25, help="the downloaded object's size")
    parser.add_argument("--only", default="train,download")
    args = parser.parse_args()
    only = set(args.only.split(","))
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp_dir, moto_process(Path(tmp_dir)) as moto:
        tmp = Path(tmp_dir)
        # This process is the benchmark's own: boto3 reads these as each client is made.
        os.environ.update(
            AWS_ENDPOINT_URL=moto.endpoint,
            AWS_ACCESS_KEY_ID=ACCESS_KEY_ID,
            AWS_SECRET_ACCESS_KEY=SECRET_ACCESS_KEY,
            AWS_DEFAULT_REGION=REGION,
        )
        moto.admin.create_bucket(Bucket=BUCKET)
        store = ObjectStore(f"s3://{BUCKET}/bench/")
        if "train" in only:
            train = measure_training(tmp, store, moto.process.pid, args.rounds, args.seconds)
            title = (
                f"training, tiny, {train['epochs']} epochs of {train['epoch_s']:.2f} s, a "
                f"checkpoint each (median of {args.rounds} rounds)"
            )
            print_table(title, train["rows"])
            say_ratio("store / local samples/s", train["ratio"], train["ratios"], TRAIN_GOAL)
            result["train"] = train
        if "download" in only:
            down = measure_download(tmp, store, moto.endpoint, args.rounds, args.gib)
            title = (
                f"download of {down['size_mib']} MiB (uploaded in {down['upload_s']:.1f} s), "
                f"{args.rounds} rounds"
            )
            print_table(title, down["rows"])
            say_ratio(
                "ObjectStore.download / boto3 download_file",
                down["ratio"],
                down["ratios"],
                DOWNLOAD_GOAL,
            )
            print(f"like for like, boto3 with ObjectStore's parts: "
                  f"{down['ratio_same_parts']:.3f}x")  # fmt: skip
            result["download"] = down
        store.client.close()
    save("storage" if only == {"train", "download"} else f"storage-{args.only}", result)


if __name__ == "__main__":
    main()
