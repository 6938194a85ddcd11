"""Where a later attempt continues: checkpoints (write, prune, resume) and the final weights.

A checkpoint holds the unwrapped module's state, the optimizer, the exact position
(epoch, batch, step and the epoch's loss so far), the RNG states, the resolved spec and
the metric points not yet confirmed stored. Resuming from it is bit-exact: the same
weights as a run never interrupted. Files are written whole or not at all
(``write_atomic``), fsynced: a kill or a power cut leaves the previous checkpoint.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn

from service.points import MetricPoint
from workers.jobfiles import write_atomic
from workers.ranks.training.spec import RunSpec

log = logging.getLogger(__name__)

# Checkpoints kept per job; older ones are deleted once a newer one is complete.
KEEP_CHECKPOINTS = 2


@dataclass(frozen=True)
class Position:
    """Where training is: the epoch to continue, batches of it done, and its loss so far."""

    epoch: int = 0
    batch: int = 0
    step: int = 0
    loss_sum: float = 0.0  # over every rank's samples of this epoch so far
    seen: float = 0.0  # samples behind loss_sum


def save(
    spec: RunSpec,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    at: Position,
    unconfirmed: list[MetricPoint],
) -> None:
    """Checkpoint the position ``at`` (rank 0 only), then drop all but the newest few."""
    state = {
        "model": _cpu_state(model),  # the unwrapped module: loads without DDP/DP
        "optimizer": optimizer.state_dict(),
        "position": asdict(at),
        "rng_cpu": torch.get_rng_state(),
        "rng_cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else [],
        "spec": spec.as_dict(),  # plain values: torch.load(weights_only=True) reads them
        # Metric points not yet confirmed in the database: a kill before they get there
        # must not leave a gap, so a resumed run sends them again (repeats are ignored).
        "metrics": [p.as_dict() for p in unconfirmed],
    }
    folder = spec.checkpoints
    # Names sort in training order, so the newest checkpoint is the last one.
    path = folder / f"epoch-{at.epoch:06d}-batch-{at.batch:08d}.pt"
    write_atomic(path, lambda p: torch.save(state, p), fsync=True)
    for old in sorted(folder.glob("epoch-*.pt"))[:-KEEP_CHECKPOINTS]:
        old.unlink(missing_ok=True)


def resume(
    spec: RunSpec,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    device: torch.device,
    rank: int,
) -> tuple[Position, list[MetricPoint]]:
    """Load the newest readable checkpoint, if any: where to continue, points to resend."""
    for path in sorted(spec.checkpoints.glob("epoch-*.pt"), reverse=True):
        try:
            state = torch.load(path, map_location=device, weights_only=True)
        except Exception:  # a damaged file: fall back to the one before
            log.warning("job %s: cannot read checkpoint %s; trying an older one", spec.job_id, path)
            continue
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["rng_cpu"].cpu())
        if state["rng_cuda"] and device.type == "cuda":
            torch.cuda.set_rng_state_all([s.cpu() for s in state["rng_cuda"]])
        at = Position(**state["position"])
        log.info("job %s: resuming from %s", spec.job_id, path.name)
        if rank != 0:  # the epoch's loss so far is carried by rank 0 alone
            at = Position(at.epoch, at.batch, at.step)
        return at, _points(state.get("metrics", []))
    return Position(), []


def _points(saved: list[dict[str, Any]]) -> list[MetricPoint]:
    """The unsent points a checkpoint kept, but those a point no longer allows (a name
    past its column, from a checkpoint written before names were bounded): resuming must
    not fail on them, and the database would refuse them anyway."""
    points = []
    for fields in saved:
        try:
            points.append(MetricPoint(**fields))
        except ValueError:
            log.warning("dropping a saved metric point that is no longer valid: %.80r", fields)
    return points


def save_model(spec: RunSpec, model: nn.Module) -> None:
    """The final weights, as safetensors (rank 0 only)."""
    write_atomic(spec.files.model, lambda p: save_file(_cpu_state(model), str(p)), fsync=True)


def _cpu_state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
