"""Why a job is where it is: the machine-readable ``reason.code`` users and scripts read.

Each code is stored as its text in ``job.reason_code`` and shown as ``reason.code``.
"""

from __future__ import annotations

from enum import StrEnum


class ReasonCode(StrEnum):
    # waiting
    queued = "queued"  # waiting for free devices; nothing went wrong
    no_worker = "no_worker"  # no registered (or running) worker can run it
    quota = "quota"  # its owner's jobs already hold their running-devices quota
    # running
    running = "running"  # a worker claimed it and its runner trains
    slurm_pending = "slurm_pending"  # submitted to Slurm, waiting in its queue (Slurm's reason)
    cancelling = "cancelling"  # cancel asked; the worker is stopping it
    # ended well, or on request
    succeeded = "succeeded"  # trained to the last epoch
    cancelled = "cancelled"  # stopped on request
    pruned = "pruned"  # a sweep's trial its pruner stopped: behind the others at a rung
    # handed back without spending an attempt
    worker_shutdown = "worker_shutdown"  # its worker stopped; resumes from its checkpoint
    preempted = "preempted"  # SIGTERM from outside: it checkpointed and stopped
    # ended by the worker's watch over the attempt
    timeout = "timeout"  # ran past timeout_s; not retried
    stalled = "stalled"  # no training step for stall_timeout_s; retried
    runner_died = "runner_died"  # the runner exited without saying how it ended; retried
    worker_lost = "worker_lost"  # its worker stopped renewing the lease; retried
    worker_restarted = "worker_restarted"  # its worker restarted mid-attempt; retried
    # ended by the training code
    error = "error"  # an exception in training, a script's exit; retried per retries_on_error
    cuda_oom = "cuda_oom"  # CUDA out of memory; the same spec would run out again
    out_of_memory = "out_of_memory"  # past its share of the box's memory; not retried
    bad_spec = "bad_spec"  # the spec cannot run on this worker (dp on CPU, say)
    bad_params = "bad_params"  # the recipe refused its params
    unknown_recipe = "unknown_recipe"  # the worker that claimed it has no such recipe
    missing_input = "missing_input"  # a blob it names is no longer stored
    requirements_failed = "requirements_failed"  # pip could not install its requirements


# Codes a queued job shows as they are; any other code on a queued job says why it was
# requeued, and the reason adds what it waits for now.
WAITING = frozenset({ReasonCode.queued, ReasonCode.no_worker, ReasonCode.quota})
