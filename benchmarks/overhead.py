"""Trainyard against the bare script: steady-state samples/s, side by side, and wall time.

    python -m benchmarks.overhead [--repeats 2] [--turn 1.0]
    python -m benchmarks.overhead --device cuda [--seconds 20]   # one GPU: single, dp, ddp

Two bare scripts: the usual one (the DataLoader fetching sample by sample, as people write
it) and the same script fetching whole batches as Trainyard's loop does. Against the first,
the ratio is what a user gains or loses by submitting to Trainyard; against the second,
like for like, it is what the service itself costs.

Steady state: the three run at once, taking turns at the machine (``benchmarks.turns``):
each alone for ``--turn`` seconds while the other two are stopped, Trainyard with every
process of it (API, worker, zygote, runner, ranks). Speed is measured from (step, time)
points every 10 steps (Trainyard's train/loss points, the bare script's own), within each
turn, first epoch left out, over the rounds of turns in which both sides made progress:
total steps over total time, and a 95% bootstrap interval of the ratio over those rounds
(the machine's own noise: one turn to the next, the same code varies by ±15%).

Whole run: one after the other, alternating, ``--repeats`` times: the bare script's
process from start to exit; Trainyard from submit to succeeded (the job's own timestamps),
followed on its event stream meanwhile.

On one GPU (``--device cuda``, ``one_device``): single, dp and ddp on that GPU, each
against the bare script that wraps its model the same way (nothing, DataParallel, DDP over
NCCL), batched fetch only, steady state only, over as many epochs as keep the bare script
busy ``--seconds`` (timed from a short run of it alone). ``one_device("cpu")`` is the same
on one CPU slot: what ``benchmarks.gpu_check`` rehearses on a box without a GPU.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from benchmarks.common import print_table, save
from benchmarks.turns import Group, cpu_seconds, descendants, progress_in_windows, take_turns
from tests.stack import REPO, Stack, running_stack
from workers.procfs import stat_fields

EPOCHS, BATCH, HIDDEN, LAYERS, SAMPLES = 5, 256, 256, 3, 65536
# Epochs for the steady state: ~45 rounds of turns past the first epoch on a fast day
# (146,000 samples/s batched, single), ~100 on a slow one.
STEADY_EPOCHS = {1: 100, 2: 40}
FETCHES = ("per-sample", "batched")
# One device: the bare script's epochs timed alone (the first warms up), and the fewest
# epochs of a steady state (the first is left out). A turn lasts at least STEPS_PER_TURN
# steps (a few of the points every 10 steps, however slow the box), and each side trains
# at least MIN_TURNS turns.
CALIBRATION_EPOCHS, MIN_STEADY_EPOCHS, STEPS_PER_TURN, MIN_TURNS = 2, 3, 50, 5
ONE_DEVICE = ("single", "dp", "ddp")


@dataclass(frozen=True)
class Case:
    """A Trainyard job and the bare script that trains the same way."""

    strategy: str  # single, dp or ddp
    world: int  # devices
    device: str = "cpu"  # cpu or cuda
    samples: int = SAMPLES  # an epoch's

    @property
    def name(self) -> str:
        return self.strategy if self.strategy == "single" else f"{self.strategy}({self.world})"

    @property
    def env(self) -> dict[str, str]:
        """What its processes' environment adds: a CPU case sees no GPU, on a GPU box too;
        a CUDA case, Trainyard and the bare script alike, the box's first GPU (PCI order)."""
        if self.device == "cpu":
            return {"CUDA_VISIBLE_DEVICES": ""}
        return {"CUDA_VISIBLE_DEVICES": "0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def _bare_command(case: Case, fetch: str, epochs: int) -> list[str]:
    wrap = "none" if case.strategy == "single" else case.strategy
    return [
        sys.executable, "-m", "benchmarks.bare_ddp", "--world", str(case.world),
        "--epochs", str(epochs), "--batch", str(BATCH), "--hidden", str(HIDDEN),
        "--layers", str(LAYERS), "--samples", str(case.samples), "--fetch", fetch,
        "--device", case.device, "--wrap", wrap,
    ]  # fmt: skip


def _submit(stack: Stack, case: Case, epochs: int) -> int:
    """The bare script's training as a Trainyard job."""
    job = stack.submit(
        recipe="mlp-regression",
        strategy=case.strategy,
        devices=case.world,
        accelerator=case.device,
        epochs=epochs,
        batch_size=BATCH,
        checkpoint_every=epochs,  # the bare script does not checkpoint either
        params={"hidden": HIDDEN, "layers": LAYERS, "train_samples": case.samples},
    )
    return int(job["id"])


def steady_state(
    case: Case, tmp: Path, turn_s: float, epochs: int, fetches: tuple[str, ...] = FETCHES
) -> dict[str, Any]:
    """Steady-state samples/s of Trainyard and the bare scripts (``fetches``), taking turns."""
    world = case.world
    # A worker with one slot per job process, so each process gets the cores the bare
    # script's processes get.
    with running_stack(tmp, cpu_slots=world) as stack:
        stack.start_worker(env=case.env)
        job_id = _submit(stack, case, epochs)
        # Claimed once the worker's zygote is warm (seconds on a loaded box); the bare
        # scripts start after it, so that none of them trains its epochs before the turns.
        stack.wait_status(job_id, {"running", "succeeded", "failed"}, 120)
        runner = stack.runner_pgid(job_id)  # the group leader: it exits when training ends
        # Their output to files, not pipes: nothing reads a pipe while they take turns, and
        # a script whose result outgrew the pipe's buffer would block, never finishing.
        outputs = {fetch: tmp / f"bare-{fetch}.json" for fetch in fetches}
        scripts = {}
        for fetch in fetches:
            with outputs[fetch].open("w") as out:
                command = _bare_command(case, fetch, epochs)
                env = os.environ | case.env
                scripts[fetch] = subprocess.Popen(command, cwd=REPO, stdout=out, env=env)
        cpu: list[dict[int, float]] = []  # CPU seconds of Trainyard's processes, each turn

        def trainyard_done() -> bool:
            # From /proc, not the API: an HTTP request would take CPU from the training
            # in Trainyard's own turn (the bare scripts' done() costs nothing either).
            if stat_fields(runner)[:1] in ([], ["Z"], ["X"]):
                return True
            cpu.append(cpu_seconds(descendants(p.pid for p in stack.procs)))
            return False

        trainyard = Group(
            "trainyard", roots=lambda: [p.pid for p in stack.procs], done=trainyard_done
        )
        bare = [
            Group(fetch, roots=lambda p=p: [p.pid], done=lambda p=p: p.poll() is not None)  # type: ignore[misc]
            for fetch, p in scripts.items()
        ]
        take_turns([trainyard, *bare], turn_s)
        job = stack.wait_status(job_id, {"succeeded", "failed", "cancelled"}, 60)
        assert job["status"] == "succeeded", job
        metrics = stack.http.get(f"/jobs/{job_id}/metrics", params={"name": "train/loss"})
        points = {"trainyard": [(m["step"], m["time"]) for m in metrics.json()]}
        for fetch, proc in scripts.items():
            assert proc.wait() == 0, f"bare script ({fetch}) exited with {proc.returncode}"
            result = json.loads(outputs[fetch].read_text().strip().splitlines()[-1])
            points[fetch] = [tuple(p) for p in result["step_times"]]

    spans = {
        g.name: progress_in_windows(points[g.name], g.windows, after_step=case.samples // BATCH)
        for g in (trainyard, *bare)
    }
    like = paired_rounds(spans["trainyard"], spans["batched"])
    if not like or len(cpu) < 2:
        raise NoSteadyState(
            f"{len(like)} turns in which both trained past the first epoch, Trainyard "
            f"{len(cpu) + 1} turns in all: more epochs, or a steadier box"
        )
    usual = paired_rounds(spans["trainyard"], spans["per-sample"]) if "per-sample" in spans else []
    low, high = bootstrap_interval(like)
    row: dict[str, Any] = service_cpu(cpu[0], cpu[-1], world)
    if usual:
        row["bare_samples_per_s"] = _rate(usual, 1)
    row["bare_batched_samples_per_s"] = _rate(like, 1)
    row["trainyard_samples_per_s"] = _rate(like, 0)
    if usual:
        row["ratio_vs_usual"] = _rate(usual, 0) / _rate(usual, 1)
    row["ratio_like_for_like"] = _rate(like, 0) / _rate(like, 1)
    row["like_for_like_95pct"] = [round(low, 3), round(high, 3)]
    row["rounds"] = len(like)
    return row


def service_cpu(first: dict[int, float], last: dict[int, float], world: int) -> dict[str, Any]:
    """CPU the service used beside the job between two snapshots, as a share of the
    training's: the ``world`` busiest processes train (the runner, or the ranks); the
    API, worker, zygote and, with ddp, the runner are the service. (The runner's own
    reporting thread trains with the job here: /proc/PID/stat sums threads.)"""
    used = sorted((last[pid] - first[pid] for pid in first.keys() & last.keys()), reverse=True)
    training, service = sum(used[:world]), sum(used[world:])
    return {"service_cpu_pct_of_training": round(100 * service / training, 2)}


Span = tuple[int, float]  # (steps, seconds) of progress in one turn


class NoSteadyState(RuntimeError):
    """Nothing to compare: no turn in which both sides trained past their first epoch
    (too few epochs for the turns, as when the box's speed changed after the timing run)."""


def paired_rounds(a: list[Span | None], b: list[Span | None]) -> list[tuple[Span, Span]]:
    """The rounds in which both made measurable progress (the same stretch of time)."""
    return [(x, y) for x, y in zip(a, b, strict=False) if x is not None and y is not None]


def _rate(rounds: list[tuple[Span, Span]], which: int) -> float:
    """Samples/s of one side (0 or 1) over the rounds: total steps over total seconds."""
    steps = sum(r[which][0] for r in rounds)
    return steps * BATCH / sum(r[which][1] for r in rounds)


def bootstrap_interval(rounds: list[tuple[Span, Span]], draws: int = 2000) -> tuple[float, float]:
    """95% interval of the ratio of rates, the rounds resampled with replacement."""
    rng = random.Random(0)
    ratios = sorted(
        _rate(sample, 0) / _rate(sample, 1)
        for sample in ([rng.choice(rounds) for _ in rounds] for _ in range(draws))
    )
    return ratios[int(0.025 * draws)], ratios[int(0.975 * draws) - 1]


def one_device(
    device: str, seconds: float, turn_s: float, samples: int = SAMPLES
) -> list[dict[str, Any]]:
    """single, dp and ddp on one device (``cuda``: one GPU; ``cpu``: one CPU slot), each
    against the bare script that wraps its model the same way: steady state, taking turns,
    each side training about ``seconds`` of its own turns, ``samples`` an epoch."""
    return [one_case(Case(s, 1, device, samples), seconds, turn_s) for s in ONE_DEVICE]


def one_case(case: Case, seconds: float, turn_s: float) -> dict[str, Any]:
    """One of ``one_device``'s rows: this case's steady state against its bare script."""
    epochs, turn = plan(case, seconds, turn_s)
    with tempfile.TemporaryDirectory() as tmp:
        steady = steady_state(case, Path(tmp), turn, epochs, fetches=("batched",))
    name = f"{case.name} on {case.device}"
    return {"strategy": name, "epochs": epochs, "turn_s": round(turn, 2), **steady}


def plan(case: Case, seconds: float, turn_s: float) -> tuple[int, float]:
    """Epochs and turn length for a steady state: turns of ``turn_s`` or STEPS_PER_TURN
    steps, whichever is longer; each side training ``seconds`` or MIN_TURNS turns past its
    first epoch. Timed from the bare script's last epoch in a short run of it alone."""
    done = subprocess.run(
        _bare_command(case, "batched", CALIBRATION_EPOCHS),
        cwd=REPO,
        check=True,
        capture_output=True,
        env=os.environ | case.env,
    )
    epoch_s = json.loads(done.stdout.decode().strip().splitlines()[-1])["epoch_times"][-1]
    turn = max(turn_s, STEPS_PER_TURN * epoch_s / (case.samples // BATCH))
    steady_s = max(seconds, MIN_TURNS * turn)
    return max(MIN_STEADY_EPOCHS, 1 + math.ceil(steady_s / epoch_s)), turn


def bare_wall(case: Case, fetch: str) -> float:
    """Seconds of the hand-written script, process start to exit."""
    start = time.perf_counter()
    command = _bare_command(case, fetch, EPOCHS)
    subprocess.run(command, cwd=REPO, check=True, capture_output=True, env=os.environ | case.env)
    return time.perf_counter() - start


def trainyard_wall(case: Case, tmp: Path) -> float:
    """Seconds of the same training as a Trainyard job, submit to succeeded."""
    with running_stack(tmp, cpu_slots=case.world) as stack:
        stack.start_worker(env=case.env)
        job_id = _submit(stack, case, EPOCHS)
        # Follow the job's event stream until it ends, as `trainyard submit --follow` does:
        # polling the API every 50 ms took CPU from the very training being measured.
        stack.events(job_id)
        done = stack.job(job_id)
        assert done["status"] == "succeeded", done
        stamps = [datetime.fromisoformat(done[k]) for k in ("created_at", "finished_at")]
        return (stamps[1] - stamps[0]).total_seconds()  # server clock


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=2, help="whole runs of each kind")
    parser.add_argument("--turn", type=float, default=1.0, help="seconds per turn")
    parser.add_argument(
        "--device", choices=["cpu", "cuda"], default="cpu", help="cuda: one GPU (one_device)"
    )
    parser.add_argument(
        "--seconds", type=float, default=20.0, help="cuda: each side's training time"
    )
    args = parser.parse_args()
    if args.device == "cuda":
        on_gpu = one_device("cuda", args.seconds, args.turn)
        print_table(f"overhead (one GPU; steady state in {args.turn:g} s turns)", on_gpu)
        save("overhead_cuda", on_gpu)
        return
    rows: list[dict[str, Any]] = []
    for case in (Case("single", 1), Case("ddp", 2)):
        world = case.world
        with tempfile.TemporaryDirectory() as tmp:
            row = {"strategy": case.name}
            row.update(steady_state(case, Path(tmp), args.turn, STEADY_EPOCHS[world]))
        walls: dict[str, list[float]] = {"per-sample": [], "batched": [], "trainyard": []}
        for _ in range(args.repeats):  # alternate, so drift in machine load hits all three
            for fetch in FETCHES:
                walls[fetch].append(bare_wall(case, fetch))
            with tempfile.TemporaryDirectory() as tmp:
                walls["trainyard"].append(trainyard_wall(case, Path(tmp)))
        wall = {k: statistics.median(v) for k, v in walls.items()}
        row.update({
            "bare_wall_s": wall["per-sample"], "bare_batched_wall_s": wall["batched"],
            "trainyard_wall_s": wall["trainyard"],
            "wall_ratio_vs_usual": wall["trainyard"] / wall["per-sample"],
            "wall_ratio_like_for_like": wall["trainyard"] / wall["batched"],
        })  # fmt: skip
        rows.append(row)
    print_table(
        f"overhead (CPU; steady state in {args.turn:g} s turns; walls median of {args.repeats})",
        rows,
    )
    save("overhead", rows)


if __name__ == "__main__":
    main()
