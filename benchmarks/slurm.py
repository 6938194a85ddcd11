"""Slurm: a job's start through Trainyard's Slurm worker against the same batch job
submitted by hand, and the worker's CPU while many jobs wait in Slurm.

    python -m benchmarks.slurm [--runs 5] [--jobs 200] [--window 30] [--only start,pending]

Both parts run against a real one-host Slurm cluster (``tests/slurm_cluster.py``: its own
munged, slurmctld and two slurmd on this machine), with a stack on SQLite (API + one
Slurm worker, ``cpu_slots`` 2) whose processes find the cluster through ``SLURM_CONF``.
Needs root, ``slurm-wlm`` and ``munge``.

1. ``start``: the ``tiny`` recipe (1 epoch of 4 steps, 256 samples, batch 64, seed 11,
   ``single`` on 1 CPU). Trainyard: time from ``POST /jobs`` to the first
   ``GET /jobs/{id}`` (polled every 20 ms) whose ``progress.step`` >= 1. By hand: the
   very batch script Trainyard generated for a job of this spec (an untimed first job,
   ``<data>/jobs/<id>/.runner/attempt-1-slurm.sh``) and its hand-off file, copied to a
   folder of an id Trainyard never gave (the id, paths and job name rewritten, the
   ``--comment`` that ties a Slurm job to a worker dropped), submitted with ``sbatch``
   from this process's environment (the worker gives sbatch its allow-list instead);
   time from the ``sbatch`` call to the first line of the runner's points file with
   step >= 1 (polled every 20 ms). So both sides run the same runner doing the same
   training under the same ``srun``; what differs is what Trainyard adds: the claim,
   writing the hand-off and script, its own ``sbatch``, and reading the points file into
   the database (its reporter, every 0.5 s). Beside each: the claim's and the
   ``sbatch``'s time (Trainyard's side) and the
   first point's own clock (the runner's stamp), so the training's start is told apart
   from how soon it is seen. The worker's poll interval at its default (1.0 s), then at
   0.25 s (a second worker run); within each, Trainyard and the hand job alternate,
   ``--runs`` times after one untimed pair; medians. Goal: Trainyard <= 1.1x the hand
   job + 0.5 s.
2. ``pending``: the partition DOWN (nothing starts), ``TRAINYARD_SLURM_MAX_PENDING``
   250, ``--jobs`` jobs submitted through the API; time until all are in Slurm's queue
   (``squeue``) and until all show reason ``slurm_pending``. Then the worker's CPU
   (``/proc/<pid>/stat``: its own utime+stime, and its reaped children's, the squeue it
   runs) over ``--window`` seconds of steady state, with slurmctld's beside it; per
   second and per job per poll (1.0 s). Side by side: the CPU of the worker's own
   ``squeue --me --states=all --format=%i|%T|%r|%N|%k`` run by hand once per second for
   the same window (the floor of the worker's polling). Then every job is cancelled
   through the API and the cluster stopped.

The workers' logs are copied to ``<tmp>/bench-slurm-logs/`` before the run's folder goes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from benchmarks.common import print_table, save
from tests.slurm_cluster import SlurmCluster
from tests.stack import Stack, running_stack, wait_for

SPEC: dict[str, Any] = {
    "recipe": "tiny",
    "strategy": "single",
    "accelerator": "cpu",
    "batch_size": 64,
    "epochs": 1,
    "seed": 11,
    "params": {"samples": 256},
}
POLL_S = 0.02  # how often both sides look for the first step
POLL_INTERVALS = [1.0, 0.25]  # the worker's setting: its default, then a quicker one
HAND_IDS = 900_000  # ids Trainyard never reaches here: the hand jobs' folders
SQUEUE = ["squeue", "--me", "--noheader", "--states=all", "--format=%i|%T|%r|%N|%k"]
TICKS = os.sysconf("SC_CLK_TCK")


# -- 1. submit to first step ------------------------------------------------------------


def through_trainyard(stack: Stack) -> dict[str, Any]:
    """POST /jobs to the first GET showing a step; the first point's own clock."""
    t0 = time.time()
    job = stack.submit(**SPEC)

    def stepped() -> float | None:
        progress = stack.job(job["id"])["progress"] or {}
        return time.time() if progress.get("step", 0) >= 1 else None

    seen = wait_for(stepped, 120, f"job {job['id']}'s first step", POLL_S)
    done = stack.wait_status(job["id"], {"succeeded", "failed"})
    assert done["status"] == "succeeded", done
    points = stack.http.get(f"/jobs/{job['id']}/metrics", params={"limit": 1}).json()
    # where the time went: the claim, and the worker's note once sbatch had answered
    logs = stack.http.get(f"/jobs/{job['id']}/logs", params={"limit": 100}).json()
    [note] = [x for x in logs if "submitted to Slurm" in x["text"]]
    return {
        "id": job["id"],
        "claimed_s": _stamp(done["started_at"]) - t0,
        "sbatch_done_s": _stamp(note["time"]) - t0,
        "point_s": _stamp(points[0]["time"]) - t0,
        "seen_s": seen - t0,
    }


def _stamp(value: float | str) -> float:
    if isinstance(value, str):  # an ISO time from the API
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    return float(value)


def hand_job(data: Path, template: int, fake: int) -> Path:
    """Trainyard's batch script and hand-off of job ``template``, as job ``fake``'s."""
    src, dst = data / "jobs" / str(template) / ".runner", data / "jobs" / str(fake) / ".runner"
    dst.mkdir(parents=True)
    handoff = json.loads((src / "attempt-1-handoff.json").read_text())
    handoff["job"]["id"] = fake
    (dst / "attempt-1-handoff.json").write_text(json.dumps(handoff))
    text = (src / "attempt-1-slurm.sh").read_text()
    text = text.replace(f"/jobs/{template}/", f"/jobs/{fake}/")
    text = text.replace(f"--job-id {template} ", f"--job-id {fake} ")
    text = text.replace(f"--job-name=trainyard-{template}", f"--job-name=byhand-{fake}")
    # no worker's comment: the worker must not take it for one of its own
    text = re.sub(r"^#SBATCH --comment=.*\n", "", text, flags=re.M)
    script = dst / "byhand.sh"
    script.write_text(text)
    return script


def by_hand(cluster: SlurmCluster, script: Path) -> dict[str, Any]:
    """sbatch to the first line of the points file with a step; that point's clock."""
    points = script.parent / "attempt-1-points.jsonl"
    t0 = time.time()
    out = cluster.run("sbatch", "--parsable", str(script))
    assert out.returncode == 0, out.stderr

    def stepped() -> tuple[float, float | None] | None:
        try:
            lines = points.read_text().splitlines()
        except FileNotFoundError:
            return None
        for line in lines:
            try:
                entry = json.loads(line)
            except ValueError:
                continue  # a line still being written
            point = entry.get("metric") or entry.get("progress") or {}
            if point.get("step", 0) >= 1:
                return time.time(), _first_stamp(lines)
        return None

    seen, stamp = wait_for(stepped, 120, f"{script}'s first step", POLL_S)
    slurm_id = out.stdout.strip().split(";")[0]
    cluster.wait_state(slurm_id, "COMPLETED", "FAILED", "CANCELLED", timeout=120)
    report = json.loads((script.parent / "attempt-1.json").read_text())
    assert report["ok"], report
    return {
        "slurm_id": slurm_id,
        "seen_s": seen - t0,
        "point_s": (stamp - t0) if stamp is not None else None,
    }


def _first_stamp(lines: list[str]) -> float | None:
    for line in lines:
        try:
            metric = json.loads(line).get("metric")
        except ValueError:
            continue
        if metric and "time" in metric:
            return float(metric["time"])
    return None


def start(cluster: SlurmCluster, root: Path, runs: int) -> dict[str, Any]:
    result: dict[str, Any] = {}
    fake = HAND_IDS
    for i, interval in enumerate(POLL_INTERVALS):
        with running_stack(root / f"start-{i}") as stack:
            stack.env.update(cluster.env)
            stack.start_worker(
                "slurm", executor="slurm", slurm_poll_interval_s=interval, cpu_slots=2
            )
            data = Path(stack.env["TRAINYARD_DATA_DIR"])
            warm = through_trainyard(stack)  # untimed: also the hand jobs' template
            fake += 1
            by_hand(cluster, hand_job(data, warm["id"], fake))
            ty, hand = [], []
            for _ in range(runs):
                ty.append(through_trainyard(stack))
                fake += 1
                hand.append(by_hand(cluster, hand_job(data, warm["id"], fake)))
                print(f"poll {interval}s: trainyard {ty[-1]}  by hand {hand[-1]}", flush=True)
            result[f"poll_{interval}s"] = _compare(ty, hand)
    return result


def _compare(ty: list[dict[str, Any]], hand: list[dict[str, Any]]) -> dict[str, Any]:
    def med(rows: list[dict[str, Any]], key: str) -> float:
        return float(statistics.median(r[key] for r in rows if r[key] is not None))

    t, h = med(ty, "seen_s"), med(hand, "seen_s")
    return {
        "trainyard_seen_s": t,
        "by_hand_seen_s": h,
        "ratio": t / h,
        "difference_s": t - h,
        "goal_s": 1.1 * h + 0.5,
        "goal_met": t <= 1.1 * h + 0.5,
        "trainyard_claimed_s": med(ty, "claimed_s"),
        "trainyard_sbatch_done_s": med(ty, "sbatch_done_s"),
        "trainyard_point_s": med(ty, "point_s"),
        "by_hand_point_s": med(hand, "point_s"),
        "trainyard_seen_range_s": [min(r["seen_s"] for r in ty), max(r["seen_s"] for r in ty)],
        "by_hand_seen_range_s": [min(r["seen_s"] for r in hand), max(r["seen_s"] for r in hand)],
        "runs": {"trainyard": ty, "by_hand": hand},
    }


# -- 2. CPU with jobs waiting in Slurm ----------------------------------------------------


def cpu_of(pid: int) -> tuple[float, float]:
    """(own utime+stime, reaped children's cutime+cstime) of a process, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    # after the command's closing parenthesis: field 3 is [0]; utime is 14, cstime 17
    own = int(fields[11]) + int(fields[12])
    children = int(fields[13]) + int(fields[14])
    return own / TICKS, children / TICKS


def pending(cluster: SlurmCluster, root: Path, jobs: int, window: float) -> dict[str, Any]:
    ctld = cluster._daemons["slurmctld"].pid  # noqa: SLF001 (whose CPU answers squeue)
    cluster.set_partition_state("DOWN")
    try:
        with running_stack(root / "pending") as stack:
            stack.env.update(cluster.env)
            worker = stack.start_worker(
                "slurm", executor="slurm", slurm_poll_interval_s=1.0, cpu_slots=2,
                slurm_max_pending=250,
            )  # fmt: skip
            t0 = time.time()
            ids = [stack.submit(**SPEC)["id"] for _ in range(jobs)]
            posted = time.time() - t0
            in_slurm = wait_for(
                lambda: len(cluster.squeue_ids()) >= jobs and time.time(), 600,
                f"{jobs} jobs in Slurm's queue", 0.5,
            )  # fmt: skip

            def all_pending() -> float | None:
                sql = "SELECT count(*) FROM job WHERE reason_code = 'slurm_pending'"
                [(n,)] = stack.query(sql)
                return time.time() if n >= jobs else None

            shown = wait_for(all_pending, 600, f"{jobs} jobs slurm_pending", 0.5)
            time.sleep(3)  # past the last submission's bookkeeping: steady state
            w0, c0, t_start = cpu_of(worker.pid), cpu_of(ctld)[0], time.monotonic()
            time.sleep(window)
            w1, c1, span = cpu_of(worker.pid), cpu_of(ctld)[0], time.monotonic() - t_start
            threads = len(os.listdir(f"/proc/{worker.pid}/task"))  # what wakes it up
            own, children = w1[0] - w0[0], w1[1] - w0[1]
            ctld_worker = c1 - c0
            # the floor: the same squeue by hand, once a second, over as long a window
            r0, c0, t_start, runs = _children_cpu(), cpu_of(ctld)[0], time.monotonic(), 0
            while time.monotonic() - t_start < window:
                tick = time.monotonic()
                out = cluster.run(*SQUEUE)
                assert out.returncode == 0 and len(out.stdout.splitlines()) >= jobs, out.stderr
                runs += 1
                time.sleep(max(0.0, 1.0 - (time.monotonic() - tick)))
            hand_span = time.monotonic() - t_start
            hand, ctld_hand = _children_cpu() - r0, cpu_of(ctld)[0] - c0
            still = stack.query("SELECT count(*) FROM job WHERE reason_code = 'slurm_pending'")
            t_cancel = time.monotonic()
            for job_id in ids:
                stack.http.post(f"/jobs/{job_id}/cancel")
            out_of_slurm = wait_for(
                lambda: not cluster.squeue_ids() and time.monotonic(),
                300,
                "Slurm's queue empty",
                0.5,
            )
            try:  # until the worker has seen each leave Slurm's queue and ended it
                cancelled: float | None = wait_for(
                    all_cancelled(stack, jobs), 300, "cancelled", 0.5
                )
            except AssertionError:
                cancelled = None
            ended = stack.query("SELECT status, count(*) FROM job GROUP BY status")
    finally:
        cluster.set_partition_state("UP")
    per_s = (own + children) / span
    return {
        "jobs": jobs,
        "post_all_s": posted,
        "submit_to_all_in_squeue_s": in_slurm - t0,
        "submit_to_all_slurm_pending_s": shown - t0,
        "window_s": span,
        "worker_threads": threads,
        "worker_cpu_s": own,
        "worker_children_cpu_s": children,
        "worker_cpu_per_s": per_s,
        "worker_own_cpu_per_s": own / span,
        "worker_cpu_per_job_per_poll_ms": per_s * 1.0 / jobs * 1000,
        "slurmctld_cpu_per_s_worker_window": ctld_worker / span,
        "squeue_by_hand_runs": runs,
        "squeue_by_hand_cpu_per_s": hand / hand_span,
        "squeue_by_hand_cpu_per_run_ms": hand / runs * 1000,
        "slurmctld_cpu_per_s_hand_window": ctld_hand / hand_span,
        "worker_over_squeue": per_s / (hand / hand_span) if hand else None,
        "slurm_pending_after_window": still[0][0],
        "cancel_to_slurm_queue_empty_s": out_of_slurm - t_cancel,
        "cancel_to_all_cancelled_s": None if cancelled is None else cancelled - t_cancel,
        "statuses_after_cancel": {s: n for s, n in ended},
    }


def all_cancelled(stack: Stack, jobs: int) -> Callable[[], float | None]:
    def check() -> float | None:
        [(n,)] = stack.query("SELECT count(*) FROM job WHERE status = 'cancelled'")
        return time.monotonic() if n >= jobs else None

    return check


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--window", type=float, default=30.0)
    parser.add_argument("--only", default="start,pending")
    args = parser.parse_args()
    reason = SlurmCluster.available()
    if reason is not None:
        raise SystemExit(reason)
    only = set(args.only.split(","))
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-slurm-") as tmp:
        root = Path(tmp)
        with SlurmCluster(root / "slurm") as cluster:
            if "start" in only:
                result["start"] = start(cluster, root, args.runs)
            if "pending" in only:
                result["pending"] = pending(cluster, root, args.jobs, args.window)
        _keep_logs(root)
    if "start" in result:
        rows = [
            {"worker poll": k.removeprefix("poll_")}
            | {k2: v2 for k2, v2 in v.items() if k2 != "runs"}
            for k, v in result["start"].items()
        ]
        print_table("submit -> first step (median)", rows)
    if "pending" in result:
        print_table("pending in Slurm", [result["pending"]])
    path = save("slurm", result)
    print(f"\nwrote {path}")


def _keep_logs(root: Path) -> None:
    """The worker logs outlive the run's folder: an odd figure can be read back."""
    keep = Path(tempfile.gettempdir()) / "bench-slurm-logs"
    keep.mkdir(exist_ok=True)
    for log in root.glob("*/worker-slurm.log"):
        subprocess.run(["cp", str(log), str(keep / f"{log.parent.name}.log")], check=False)


if __name__ == "__main__":
    main()
