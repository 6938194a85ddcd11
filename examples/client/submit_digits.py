"""Train the digits example with the Python client: submit the recipe package in
examples/recipe_package (its ``digits-mlp`` recipe) with digits.npz as its data, follow
the job's events, print its final metrics, and download the trained model.

    python examples/make_digits.py digits.npz
    python examples/client/submit_digits.py models/ --data digits.npz --epochs 3

The server is TRAINYARD_URL (its token TRAINYARD_API_TOKEN), as for the CLI. Exits 1 if
the job did not succeed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from trainyard import Client, Event, Job

PACKAGE = Path(__file__).resolve().parent.parent / "recipe_package"
MODEL = "model.safetensors"


class Follower:
    """Prints a job's events compactly: each status change, and one line per epoch with
    the latest value of each metric reported in it."""

    def __init__(self) -> None:
        self.status: str | None = None
        self.epoch: int | None = None
        self.latest: dict[str, Any] = {}

    def event(self, event: Event) -> None:
        if (job := event.job) is not None and job.status != self.status:
            self.flush()  # the epoch's line before the status that followed it
            self.status = job.status
            where = f" on {job.worker_id}" if job.status == "running" and job.worker_id else ""
            print(f"job {job.id}: {job.status}{where}")
        elif (point := event.metric) is not None:
            if point.epoch != self.epoch:
                self.flush()
                self.epoch = point.epoch
            self.latest[point.name] = point.value
        elif event.kind == "end":
            self.flush()

    def flush(self) -> None:
        if self.latest:
            print(f"  epoch {self.epoch}: {shown(self.latest)}")
        self.latest = {}


def shown(values: dict[str, Any]) -> str:
    return "  ".join(
        f"{name}={value:.4g}" if isinstance(value, float) else f"{name}={value}"
        for name, value in sorted(values.items())
    )


def final_metrics(job: Job) -> dict[str, Any]:
    """The last value of each metric the job reported."""
    return {point.name: point.value for point in job.metrics()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="folder to download the model into")
    parser.add_argument("--data", type=Path, default=Path("digits.npz"))
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--hidden", type=int, default=64, help="the hidden layer's width")
    parser.add_argument("--strategy", default="single", help="single, dp or ddp")
    parser.add_argument("--devices", type=int, default=1)
    args = parser.parse_args()
    if not args.data.is_file():
        sys.exit(f"{args.data}: no such file; write it with: python examples/make_digits.py")

    with Client() as client:
        job = client.submit_code(
            PACKAGE,
            recipe="digits-mlp",
            data={"digits.npz": args.data},
            epochs=args.epochs,
            params={"hidden": args.hidden},
            strategy=args.strategy,
            devices=args.devices,
        )
        print(f"submitted job {job.id} to {client.url}")
        follower = Follower()
        for event in job.events():
            follower.event(event)
        job.refresh()
        if job.status != "succeeded":
            reason = f": {job.reason.code}: {job.reason.message}" if job.reason else ""
            print(f"job {job.id} {job.status}{reason}", file=sys.stderr)
            return 1
        print(f"final metrics: {shown(final_metrics(job))}")
        args.out.mkdir(parents=True, exist_ok=True)
        path = job.download(MODEL, args.out)
        print(f"model: {path} ({path.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
