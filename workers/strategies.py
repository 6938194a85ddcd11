"""single, dp and ddp: where each rank runs and how ranks meet. The loop is in training.py."""

from __future__ import annotations

import json
import logging
import os
import queue
import signal
import sys
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from workers.errors import describe
from workers.recipes import load_recipes
from workers.stdio import prefix_stdio
from workers.training import Preempted, RunSpec, Sink, stop_on_sigterm, train
from workers.zygote import RANK_START_ENV

log = logging.getLogger(__name__)

# Ranks must all join the process group within this; a rank that never comes fails the job.
INIT_TIMEOUT_S = 60.0
# Longest a collective may wait for a peer before the attempt fails (a hung or dead rank).
COLLECTIVE_TIMEOUT_S = 120.0
# When one rank dies, how long the others get to exit before SIGTERM, then SIGKILL.
RANK_EXIT_GRACE_S = 3.0


def run(spec: RunSpec, sink: Sink) -> dict[str, float]:
    """Train the job with its strategy; returns rank 0's final metrics."""
    if spec.strategy == "ddp":
        return _run_ddp(spec, sink)
    torch.set_num_threads(spec.threads)
    device = torch.device("cuda", 0) if spec.accelerator == "cuda" else torch.device("cpu")
    recipe = load_recipes(Path(spec.recipes_dir) if spec.recipes_dir else None)[spec.recipe]
    return train(0, spec, recipe, device, sink)


def _run_ddp(spec: RunSpec, sink: Sink) -> dict[str, float]:
    # The runner hosts the rendezvous store on a port the OS picks (port 0): no fixed
    # port, and no window between "find a free port" and "bind it" for a race.
    store = dist.TCPStore(
        "127.0.0.1",
        0,
        spec.world_size + 1,
        is_master=True,
        wait_for_workers=False,
        timeout=timedelta(seconds=INIT_TIMEOUT_S),
    )
    # A runner forked from the warm zygote forks its ranks too (torch already imported,
    # CUDA untouched); a runner started as a fresh interpreter spawns them.
    start_method = os.environ.get(RANK_START_ENV, "spawn")
    ctx = mp.get_context(start_method)
    events: Any = ctx.Queue()
    result: dict[str, Any] = {}
    forwarder = _Forwarder(events, sink, result)
    forwarder.start()
    try:
        context = mp.start_processes(
            _rank_main,
            args=(spec, store.port, events),
            nprocs=spec.world_size,
            join=False,
            start_method=start_method,
        )
        # join raises once any rank fails; the others then get RANK_EXIT_GRACE_S to exit,
        # SIGTERM, the same again, then SIGKILL (torch's default grace is 30 s each).
        try:
            while not context.join(grace_period=RANK_EXIT_GRACE_S):
                pass
        except Exception as exc:
            # mp.spawn names the first rank it saw fail, often a survivor whose collective
            # broke; how each rank ended tells who really went first (e.g. a SIGKILL).
            raise RanksFailed(_how_ranks_ended(context.processes)) from exc
    finally:
        events.put(None)
        forwarder.join()
    if "preempted" in result:
        raise Preempted(result["preempted"])
    return result


class RanksFailed(RuntimeError):
    """A DDP rank failed; the message says how every rank ended."""


def _how_ranks_ended(processes: list[Any]) -> str:
    ends = []
    for rank, proc in enumerate(processes):
        code = proc.exitcode
        if code is not None and code < 0:
            ends.append(f"rank {rank} killed by {signal.Signals(-code).name}")
        else:
            ends.append(f"rank {rank} exited with {code}")
        # Ranks SIGTERMed by mp.spawn after the first failure show up here too.
    return "; ".join(ends)


class _Forwarder:
    """Moves rank 0's events from the spawn queue to the runner's sink, keeping the result."""

    def __init__(self, events: Any, sink: Sink, result: dict[str, Any]) -> None:
        self.events, self.sink, self.result = events, sink, result
        self.thread = threading.Thread(target=self._loop, name="rank0-events", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def join(self) -> None:
        self.thread.join(timeout=30)

    def _loop(self) -> None:
        while True:
            try:
                item = self.events.get(timeout=1.0)
            except queue.Empty:
                continue
            if item is None:
                return
            if item[0] == "result":
                self.result.update(item[1])
            elif item[0] == "preempted":
                self.result["preempted"] = item[1]
            else:
                self.sink.put_nowait(item)


def _rank_main(rank: int, spec: RunSpec, port: int, events: Any) -> None:
    """One DDP rank: join the group, train, meet the others at a barrier, leave."""
    prefix_stdio(f"[rank {rank}] ", spec.job_id)
    stop_on_sigterm()
    torch.set_num_threads(spec.threads)
    cuda = spec.accelerator == "cuda"
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    store = dist.TCPStore(
        "127.0.0.1",
        port,
        spec.world_size + 1,
        is_master=False,
        timeout=timedelta(seconds=INIT_TIMEOUT_S),
    )
    dist.init_process_group(
        "nccl" if cuda else "gloo",
        store=store,
        rank=rank,
        world_size=spec.world_size,
        timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S),
    )
    log.info("rank %d of %d joined the %s group", rank, spec.world_size, dist.get_backend())
    clean = False
    try:
        recipe = load_recipes(Path(spec.recipes_dir) if spec.recipes_dir else None)[spec.recipe]
        try:
            result = train(rank, spec, recipe, device, events if rank == 0 else None)
            if rank == 0:
                events.put(("result", result))
        except Preempted as stop:  # every rank stops at the same step, checkpoint written
            if rank == 0:
                events.put(("preempted", str(stop)))
        # Every rank reaches this before any tears down: destroying the group while a
        # peer is still in a collective aborts gloo at exit (seen: ~1 run in 10).
        dist.barrier()
        clean = True
    except BaseException as exc:
        error_path = (
            Path(spec.job_dir) / ".runner" / f"attempt-{spec.attempt}-rank-{rank}-error.json"
        )
        error_path.parent.mkdir(parents=True, exist_ok=True)
        error_path.write_text(json.dumps(describe(exc, rank)))
        raise
    finally:
        if clean:
            dist.destroy_process_group()
        sys.stdout.flush()
        sys.stderr.flush()
    # Leave without the interpreter's teardown. Even after a barrier and a clean
    # destroy_process_group(), a gloo rank still aborted at exit once in CI ("terminate
    # called without an active exception": a C++ thread destroyed while joinable during
    # finalisation). Everything this rank owes is done: its events are flushed below, its
    # output above, its checkpoints were os.replace()d. So exit now, with status 0.
    if rank == 0:
        events.close()
        events.join_thread()  # the queue's feeder thread has written everything
    os._exit(0)
