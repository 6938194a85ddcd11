"""A job's folder on the worker's disk: where each file lives, and the one way to write one.

    jobs/<id>/model.safetensors        the final weights (an artifact)
    jobs/<id>/spec.json                the resolved spec and environment (an artifact)
    jobs/<id>/checkpoints/             where a later attempt resumes (artifacts); a
                                       script's $TRAINYARD_CHECKPOINT_DIR
    jobs/<id>/output/                  a script's $TRAINYARD_OUTPUT_DIR (artifacts)
    jobs/<id>/.inputs/                 a script's $TRAINYARD_INPUT_DIR: its data files
                                       (a node's: .runner/node-<n>/inputs/)
    jobs/<id>/.runner/                 the runner's hand-offs, hidden from the API (a
                                       job across boxes: .runner/node-<n>/ for each
                                       node, as DATA_DIR may be one folder all share):
        attempt-<n>.json               how attempt n ended (runner -> supervisor)
        attempt-<n>-result.json        rank 0's final metrics (rank 0 -> runner)
        attempt-<n>-rank-<r>-error.json  a rank's own error report (rank -> runner)
        attempt-<n>-points.jsonl       rank 0's progress and metric points (rank 0 ->
                                       supervisor, which stores them)
        attempt-<n>-environment.json   the attempt's environment record (runner ->
                                       supervisor, which stores it)
        metrics-flushed                the last step whose metric points are stored
                                       (supervisor -> the next attempt's rank 0)
        attempt-<n>-metrics.jsonl      a script's $TRAINYARD_METRICS_FILE
        torchrun/                      torchrun's copies of a ddp script's rank output

Every file here is written whole or not at all (``write_atomic``): a kill at any moment
leaves the old file or the new one, never half of one.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from service.artifacts import job_dir
from service.models import Job
from service.reasons import ReasonCode
from workers.errors import NotRetryable

MODEL_FILE = "model.safetensors"
SPEC_FILE = "spec.json"
CHECKPOINTS = "checkpoints"
OUTPUT = "output"
INPUTS = ".inputs"
RUNNER = ".runner"


@dataclass(frozen=True)
class JobFiles:
    """The paths of one job's files."""

    root: Path
    runner: str = RUNNER  # where the hand-offs are, under root

    @classmethod
    def of(cls, data_dir: Path, job_id: int, node: int | None = None) -> JobFiles:
        """The job's files; ``node``: this box's node of a job across boxes."""
        return cls(job_dir(data_dir, job_id).resolve(), runner_dir(node))

    @property
    def model(self) -> Path:
        return self.root / MODEL_FILE

    @property
    def spec(self) -> Path:
        return self.root / SPEC_FILE

    @property
    def checkpoints(self) -> Path:
        return self.root / CHECKPOINTS

    @property
    def output(self) -> Path:
        return self.root / OUTPUT

    @property
    def inputs(self) -> Path:
        # a node's own: each node of a job across boxes places its links there
        return self.root / INPUTS if self.runner == RUNNER else self.root / self.runner / "inputs"

    @property
    def flushed_marker(self) -> Path:
        return self.root / self.runner / "metrics-flushed"

    def outcome(self, attempt: int) -> Path:
        return self.root / self.runner / f"attempt-{attempt}.json"

    def result(self, attempt: int) -> Path:
        return self.root / self.runner / f"attempt-{attempt}-result.json"

    def points(self, attempt: int) -> Path:
        return self.root / self.runner / f"attempt-{attempt}-points.jsonl"

    def environment(self, attempt: int) -> Path:
        return self.root / self.runner / f"attempt-{attempt}-environment.json"

    def metrics_file(self, attempt: int) -> Path:
        return self.root / self.runner / f"attempt-{attempt}-metrics.jsonl"

    @property
    def torchrun_logs(self) -> Path:
        return self.root / self.runner / "torchrun"

    def rank_error(self, attempt: int, rank: int) -> Path:
        return self.root / self.runner / f"attempt-{attempt}-rank-{rank}-error.json"

    def hand_off(self, name: str, attempt: int) -> bool:
        """Whether a file of the hand-offs folder is one of attempt ``attempt``'s (what an
        earlier run of that attempt number left is removed before it starts again)."""
        prefix = f"attempt-{attempt}"
        own = {f"{prefix}.json", f"{prefix}-result.json", f"{prefix}-metrics.jsonl",
               f"{prefix}-points.jsonl", f"{prefix}-environment.json",
               f"{prefix}-handoff.json", f"{prefix}-slurm.sh", f"{prefix}-slurm.out",
               f"{prefix}-slurm.err", f"{prefix}-slurm.out.stored",
               f"{prefix}-slurm.err.stored"}  # fmt: skip
        return name in own or (name.startswith(f"{prefix}-rank-") and name.endswith("-error.json"))

    def rank_errors(self, attempt: int) -> list[Path]:
        """Every rank's error report of an attempt, lowest rank first."""
        return sorted((self.root / self.runner).glob(f"attempt-{attempt}-rank-*-error.json"))


def shared_checkpoints(job: Job, shared_dir: Path | None, *, in_store: bool = False) -> str | None:
    """A job across boxes' checkpoint folder, in the folder every box shares (None for a
    job on one box, and where checkpoints go to the object store (``in_store``): its own
    folder's, which the worker keeps in the store)."""
    if job.nodes == 1 or in_store:
        return None
    if shared_dir is None:  # the supervisor joins no gang without one
        raise NotRetryable(
            ReasonCode.bad_spec, "a job across boxes needs TRAINYARD_SHARED_DIR on its workers"
        )
    assert job.id is not None
    return str(JobFiles.of(shared_dir, job.id).checkpoints)


def runner_dir(node: int | None) -> str:
    """Where an attempt's hand-offs are: one folder per node of a job across boxes."""
    return RUNNER if node is None else f"{RUNNER}/node-{node}"


def write_atomic(
    path: Path, data: str | bytes | Callable[[Path], object], *, fsync: bool = False
) -> None:
    """Write ``path`` whole or not at all: to a hidden temp file beside it, then rename.

    ``data`` is the text or bytes, or a function that writes a given path (torch.save,
    safetensors). ``fsync``: also survive a power cut, for files worth the ~ms (weights,
    checkpoints)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    if isinstance(data, str):
        tmp.write_text(data)
    elif isinstance(data, bytes):
        tmp.write_bytes(data)
    else:
        data(tmp)
    if fsync:
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
    os.replace(tmp, path)
