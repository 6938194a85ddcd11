"""Sweeps: ASHA against the full grid, a trial's start against a plain job's, and the
sweep driver's CPU per trial.

    python -m benchmarks.sweeps [--passes 16] [--pairs 7] [--trials 1000]
                                [--only asha,start,driver]

1. ``asha``: a running stack (API + one worker with 2 CPU slots, SQLite) runs the grid of
   27 configurations of ``digits_sweep/train.py`` (an MLP on the 8x8 digits, 9 epochs of
   ``--passes`` passes over the data: 3 learning rates x 3 widths x 3 batch sizes) twice,
   one sweep after the other: the full grid, then the same grid with an ASHA pruner
   (min_resource 1, reduction_factor 3: rungs at epochs 1, 3, 9). Metric val/accuracy,
   max; 2 trials at once. Each: its best accuracy and its device-seconds (over its trial
   jobs, (finished_at - started_at) x devices). Goals: ASHA's best within 0.5 points of
   the grid's; its device-seconds <= 40% of the grid's. Beside them, where the time went:
   each trial's fixed cost (claim to first point, less an epoch), each prune's timing
   (the point it judged, the prune, the job's end), and two replays of the grid's
   curves: Optuna's pruner fed them in the sweep's order, each stop at once, and the
   textbook synchronous successive halving.
2. ``start``: the same script, one epoch, as the only trial of a sweep (the sweep's
   created_at to its trial's first metric point) and as a plain job (its created_at to
   its first point), alternating ``--pairs`` times after an untimed pair, one at a time;
   medians, of the point's stored time and of the script's own clock. Goal: the trial
   no slower than the job.
3. ``driver`` (``sweep_driver.py``): ``service.sweeps.driver.Driver`` in this process
   on a fresh SQLite database with a registered worker row; no training: a loop plays
   the worker through the store's own functions (claim, a val/loss point per epoch,
   finish; a pruned trial's stop). CPU (``time.thread_time``) inside ``drive()`` alone,
   per trial, for a ``--trials``-trial random and TPE search of the ``tiny`` recipe,
   with and without ASHA; how much of it is Optuna's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from datetime import datetime
from pathlib import Path
from typing import Any

from benchmarks.common import print_table, save
from benchmarks.sweep_driver import driver_cpu
from tests.scripts import digits_file, put_blob, put_package
from tests.stack import Stack, running_stack, wait_for

SCRIPT = Path(__file__).parent / "digits_sweep"
EPOCHS = 9
GRID = {
    "lr": [0.3, 0.03, 0.003],
    "width": [16, 64, 256],
    "batch_size": [16, 64, 256],
}
ASHA: dict[str, Any] = {"type": "asha", "min_resource": 1, "reduction_factor": 3}
SLOTS = 2
PASSES = 16  # passes over the data per epoch: 0.06-3 s of training here, by batch size


def entrypoint(epochs: int, passes: int, **values: Any) -> list[str]:
    """The script's command: a sweep's placeholders, or a plain job's values."""
    args = {"lr": "{lr}", "width": "{width}", "batch_size": "{batch_size}", **values}
    return ["python", "train.py", "--lr", str(args["lr"]), "--width", str(args["width"]),
            "--batch-size", str(args["batch_size"]), "--epochs", str(epochs),
            "--passes", str(passes)]  # fmt: skip


def post_sweep(stack: Stack, **body: Any) -> dict[str, Any]:
    body = {"metric": "val/accuracy", "mode": "max", "search": "grid", **body}
    r = stack.http.post("/sweeps", json=body)
    assert r.status_code == 201, r.text
    return r.json()  # type: ignore[no-any-return]


def wait_sweep(stack: Stack, sweep_id: int, timeout_s: float) -> dict[str, Any]:
    return wait_for(
        lambda: (s := stack.http.get(f"/sweeps/{sweep_id}").json())["status"] != "running" and s,
        timeout_s,
        f"sweep {sweep_id} to end",
        0.5,
    )


def wait_job(stack: Stack, job_id: int) -> None:
    """Until the job succeeded, polled as a sweep is (every 0.5 s): a client polling
    faster takes CPU from the job's start on two cores."""
    wait_for(lambda: stack.job(job_id)["status"] == "succeeded", 120, f"job {job_id}", 0.5)


def trial_jobs(stack: Stack, sweep_id: int) -> list[dict[str, Any]]:
    listed = stack.http.get("/jobs", params={"sweep": sweep_id, "limit": 500}).json()
    assert listed["total"] == len(listed["items"])
    return listed["items"]  # type: ignore[no-any-return]


def seconds(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def first_point(stack: Stack, job_id: int) -> float:
    """The time of the job's first val/accuracy point (the runner stores a few at a time)."""

    def stored() -> float | None:
        params: dict[str, Any] = {"name": "val/accuracy", "limit": 1}
        points = stack.http.get(f"/jobs/{job_id}/metrics", params=params).json()
        return points[0]["time"] if points else None

    return wait_for(stored, 10, f"job {job_id}'s first point")


def run_grid(stack: Stack, job: dict[str, Any], pruner: dict[str, Any] | None) -> dict[str, Any]:
    """One sweep of the whole grid: its best, device-seconds, and where the time went."""
    parameters = {name: {"type": "categorical", "values": v} for name, v in GRID.items()}
    sweep = post_sweep(stack, job=job, parameters=parameters, max_parallel=SLOTS, pruner=pruner)
    done = wait_sweep(stack, sweep["id"], 1800)
    assert done["status"] == "finished", done["reason"]
    jobs = {j["id"]: j for j in trial_jobs(stack, sweep["id"])}
    device_s = sum(
        (seconds(j["finished_at"]) - seconds(j["started_at"])) * j["devices"] for j in jobs.values()
    )
    times, trials, fixed = {}, [], []
    for t in done["trials"]:
        job = jobs[t["job_id"]]
        points = stack.http.get(f"/jobs/{job['id']}/metrics", params={"name": "val/accuracy"})
        at = times[job["id"]] = {p["epoch"]: p["time"] for p in points.json()}
        trial = {
            "values": t["values"], "status": t["status"], "pruned": t["pruned"],
            "last": t["last"], "curve": [round(p["value"], 4) for p in points.json()],
            "device_s": round(seconds(job["finished_at"]) - seconds(job["started_at"]), 2),
        }  # fmt: skip
        if len(at) >= 3:
            # An epoch's time from the later points; a trial's fixed cost: from its claim
            # to its first point, less one epoch (the interpreter, torch, the data).
            trial["epoch_s"] = round((max(at.values()) - min(at.values())) / (len(at) - 1), 3)
            fixed.append(min(at.values()) - seconds(job["started_at"]) - trial["epoch_s"])
        trials.append(trial)
    best = done["best"]
    return {
        "pruner": "asha" if pruner else "none",
        "trials": len(jobs),
        "pruned": sum(t["pruned"] for t in trials),
        "best_accuracy": best["last"],
        "best_values": best["values"],
        "device_s": round(device_s, 1),
        "wall_s": round(seconds(done["finished_at"]) - seconds(done["created_at"]), 1),
        "epochs_trained": sum(len(t["curve"]) for t in trials),
        "fixed_s_per_trial_p50": round(statistics.median(fixed), 2) if fixed else None,
        "pruning": pruning(stack, done, jobs, times) if pruner else None,
        "trials_by_number": trials,
    }


def pruning(
    stack: Stack,
    done: dict[str, Any],
    jobs: dict[int, dict[str, Any]],
    times: dict[int, dict[int, float]],
) -> dict[str, Any]:
    """For each pruned trial: the epoch of the last point the driver had when it pruned
    (its message says it), the epochs trained, and the seconds from that point's time
    (when the runner read it) to the prune (the audit's time) and on to the job's end."""
    pruned_at = {
        int(e["target"].split()[-1]): seconds(e["at"])
        for e in stack.http.get("/audit", params={"limit": 500}).json()["items"]
        if e["action"] == "pruned"
    }
    rows = []
    for t in done["trials"]:
        if not t["pruned"]:
            continue
        job_id = t["job_id"]
        decided = int(t["reason"]["message"].split(" at epoch ")[1].split(":")[0])
        rows.append({
            "decided_at_epoch": decided,
            "epochs_trained": max(times[job_id]),
            "point_to_prune_s": round(pruned_at[job_id] - times[job_id][decided], 2),
            "prune_to_end_s": round(seconds(jobs[job_id]["finished_at"]) - pruned_at[job_id], 2),
        })  # fmt: skip
    return {
        "point_to_prune_p50_s": statistics.median(r["point_to_prune_s"] for r in rows),
        "prune_to_end_p50_s": statistics.median(r["prune_to_end_s"] for r in rows),
        "pruned_after_last_epoch": sum(r["epochs_trained"] == EPOCHS for r in rows),
        "trials": rows,
    }


def asha_alone(grid: dict[str, Any], order: list[dict[str, Any]], batch: int) -> dict[str, Any]:
    """The same pruner fed the grid's curves in the ASHA sweep's order, one trial at a
    time, ``batch`` points at a time with one question (prune?) after each batch, each
    trial stopped the moment it is pruned: the epochs ASHA itself would train with no time
    between a point and its stop (``batch`` 1: as Optuna's pruners expect to be fed)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    of = {json.dumps(t["values"], sort_keys=True): t for t in grid["trials_by_number"]}
    pruner = optuna.pruners.SuccessiveHalvingPruner(
        min_resource=ASHA["min_resource"], reduction_factor=ASHA["reduction_factor"]
    )
    study = optuna.create_study(direction="maximize", pruner=pruner)
    epochs, pruned, best, device_s = 0, 0, 0.0, 0.0
    for values in order:
        grid_trial = of[json.dumps(values, sort_keys=True)]
        curve = grid_trial["curve"]
        # its cost: the grid trial's, less the epochs it would not train
        device_s += grid_trial["device_s"] - len(curve) * grid_trial["epoch_s"]
        trial = study.ask()
        for epoch, value in enumerate(curve, 1):
            epochs += 1
            device_s += grid_trial["epoch_s"]
            trial.report(value, epoch)
            asked = epoch % batch == 0 and epoch < len(curve)  # none at the last: no gain
            if asked and trial.should_prune():
                study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                pruned += 1
                break
        else:
            study.tell(trial, curve[-1])
            best = max(best, curve[-1])
    return {
        "batch": batch,
        "epochs_trained": epochs,
        "pruned": pruned,
        "best_accuracy": best,
        "device_s_ratio": round(device_s / grid["device_s"], 3),
    }


def successive_halving(grid: dict[str, Any]) -> dict[str, Any]:
    """The textbook, synchronous successive halving on the grid's curves: all 27 to
    epoch 1, the best 9 on to epoch 3, the best 3 to the end (63 epochs); its
    device-seconds from the grid's trials, as ``asha_alone`` counts them."""
    trials = grid["trials_by_number"]
    keep = len(trials)
    epochs = dict.fromkeys(range(len(trials)), 1)
    for rung in (1, 3):
        keep //= ASHA["reduction_factor"]
        ranked = sorted(epochs, key=lambda i: -trials[i]["curve"][rung - 1])
        for i in [i for i in ranked if epochs[i] == rung][:keep]:
            epochs[i] = rung * ASHA["reduction_factor"]
    device_s = sum(
        t["device_s"] - (len(t["curve"]) - epochs[i]) * t["epoch_s"] for i, t in enumerate(trials)
    )
    best = max(t["curve"][-1] for i, t in enumerate(trials) if epochs[i] == EPOCHS)
    return {
        "epochs_trained": sum(epochs.values()),
        "best_accuracy": best,
        "device_s_ratio": round(device_s / grid["device_s"], 3),
        "fixed_share_of_grid": round(
            sum(t["device_s"] - len(t["curve"]) * t["epoch_s"] for t in trials) / grid["device_s"],
            3,
        ),
    }


def asha_against_grid(stack: Stack, job: dict[str, Any]) -> list[dict[str, Any]]:
    """The grid in full, then with ASHA, one after the other on one stack."""
    return [run_grid(stack, job, None), run_grid(stack, job, ASHA)]


def written(stack: Stack, job_id: int) -> float:
    """When the script wrote its first point, by its own clock (its log line)."""

    def logged() -> float | None:
        lines = stack.http.get(f"/jobs/{job_id}/logs", params={"limit": 1000}).json()
        said = [float(x["text"].split()[-1]) for x in lines if "first-point" in x["text"]]
        return said[0] if said else None

    return wait_for(logged, 10, f"job {job_id}'s first-point line")


def start_pairs(stack: Stack, job: dict[str, Any], passes: int, pairs: int) -> dict[str, Any]:
    """Submit to first point: a sweep's only trial against a plain job, in turns, after
    an untimed pair (the package unpacked, Optuna imported by the driver). The point's
    stored time (the runner's, read from the file every 0.5 s), and the script's own
    time of writing it."""
    values = {"lr": 0.03, "width": 64, "batch_size": 64}
    runs: dict[str, list[float]] = {}
    for _ in range(pairs + 1):
        sweep = post_sweep(
            stack,
            job={**job, "entrypoint": entrypoint(1, passes)},
            parameters={k: {"type": "categorical", "values": [v]} for k, v in values.items()},
            max_parallel=1,
        )
        done = wait_sweep(stack, sweep["id"], 120)
        [trial] = done["trials"]
        created = seconds(sweep["created_at"])
        runs.setdefault("trial", []).append(first_point(stack, trial["job_id"]) - created)
        runs.setdefault("trial_written", []).append(written(stack, trial["job_id"]) - created)
        # the driver's part: from the sweep's row to its trial's job
        job_created = seconds(stack.job(trial["job_id"])["created_at"])
        runs.setdefault("sweep_to_trial_job", []).append(job_created - created)
        plain = stack.submit(**{**job, "entrypoint": entrypoint(1, passes, **values)})
        wait_job(stack, plain["id"])
        created = seconds(plain["created_at"])
        runs.setdefault("plain", []).append(first_point(stack, plain["id"]) - created)
        runs.setdefault("plain_written", []).append(written(stack, plain["id"]) - created)
    out: dict[str, Any] = {"pairs": pairs}
    for name, got in runs.items():  # the first pair untimed
        out[f"{name}_p50_s"] = round(statistics.median(got[1:]), 3)
    for kind in ("", "_written"):
        pairs_of = zip(runs[f"trial{kind}"][1:], runs[f"plain{kind}"][1:], strict=True)
        diffs = [t - p for t, p in pairs_of]
        out[f"trial_minus_plain{kind}_p50_s"] = round(statistics.median(diffs), 3)
    out["runs_s"] = {name: [round(x, 3) for x in got] for name, got in runs.items()}
    return out


def on_stack(passes: int, pairs: int, parts: set[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp, running_stack(Path(tmp)) as stack:
        stack.start_worker()
        job = {
            "code": put_package(stack.http, SCRIPT, Path(tmp)),
            "entrypoint": entrypoint(EPOCHS, passes),
            "data": {"digits.npz": put_blob(stack.http, digits_file(Path(tmp)))},
            "accelerator": "cpu",
        }
        if "start" in parts:
            out["start"] = start_pairs(stack, job, passes, pairs)
        if "asha" in parts:
            out["asha"] = asha_against_grid(stack, job)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--passes", type=int, default=PASSES, help="passes over the data per epoch")
    parser.add_argument("--pairs", type=int, default=7)
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--only", default="asha,start,driver")
    args = parser.parse_args()
    parts = set(args.only.split(","))
    result: dict[str, Any] = {"passes": args.passes}
    if parts & {"asha", "start"}:
        result |= on_stack(args.passes, args.pairs, parts)
    if "driver" in parts:
        result["driver"] = driver_cpu(args.trials)
    show(result, args.trials)
    name = "sweeps" if parts == {"asha", "start", "driver"} else "sweeps-" + "-".join(sorted(parts))
    if args.passes != PASSES:
        name += f"-passes{args.passes}"
    save(name, result)


def show(result: dict[str, Any], trials: int) -> None:
    """The tables (the result file keeps every trial's values and figures)."""
    if "asha" in result:
        grid, asha = result["asha"]
        result["asha_summary"] = {
            "accuracy_points_below_grid": round(
                100 * (grid["best_accuracy"] - asha["best_accuracy"]), 2
            ),
            "device_s_ratio": round(asha["device_s"] / grid["device_s"], 3),
        }
        order = [t["values"] for t in asha["trials_by_number"]]
        result["asha_alone"] = [asha_alone(grid, order, batch) for batch in (1, 2, 3)]
        result["successive_halving"] = successive_halving(grid)
        long = ("trials_by_number", "pruning")
        print_table(
            "ASHA against the full grid (27 points, one after the other)",
            [{k: v for k, v in r.items() if k not in long} for r in result["asha"]],
        )
        print_table("ASHA / grid", [result["asha_summary"]])
        if asha["pruning"]:
            print_table(
                "ASHA's stops (medians)",
                [{k: v for k, v in asha["pruning"].items() if k != "trials"}],
            )
        print_table("ASHA alone: the grid's curves, each stop at once", result["asha_alone"])
        print_table(
            "synchronous successive halving, the grid's curves", [result["successive_halving"]]
        )
    if "start" in result:
        medians = {k: v for k, v in result["start"].items() if k == "pairs" or "p50" in k}
        print_table("submit -> first metric point (medians)", [medians])
    if "driver" in result:
        print_table(f"sweep driver CPU per trial ({trials} trials)", result["driver"])


if __name__ == "__main__":
    main()
