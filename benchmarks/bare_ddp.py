"""The script people write instead of using Trainyard: mp.spawn + DistributedSampler + DDP.

Same model, data, batch and epochs as the Trainyard job it is compared with; hand-written
loop, no reporting, validation on rank 0 each epoch. Prints one JSON line: epoch times,
and (step, time) every 10 steps, the points Trainyard records its train/loss at.

    python -m benchmarks.bare_ddp --world 2 --epochs 4 [--fetch batched] ...

``--fetch per-sample`` (the default) is the DataLoader as people use it: a ``dataset[i]``
per sample, stacked. ``--fetch batched`` indexes the TensorDataset a batch at a time, as
Trainyard's loop does, to compare like with like.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler

from workers.recipes.builtin import RegressionParams, _regression_data, _regression_model


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def worker(rank: int, args: argparse.Namespace, port: int, out: mp.SimpleQueue) -> None:  # type: ignore[type-arg]
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // args.world))
    if args.world > 1:
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=args.world,
            timeout=timedelta(seconds=60),
        )
    params = RegressionParams(hidden=args.hidden, layers=args.layers, train_samples=args.samples)
    train, val = _regression_data(params, args.seed)
    torch.manual_seed(args.seed)
    model: nn.Module = _regression_model(params)
    if args.world > 1:
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sampler = DistributedSampler(train, num_replicas=args.world, rank=rank, seed=args.seed)
    local_batch = args.batch // args.world
    if args.fetch == "batched":
        order = BatchSampler(sampler, local_batch, drop_last=False)
        loader = DataLoader(train, batch_size=None, sampler=order)
    else:
        loader = DataLoader(train, batch_size=local_batch, sampler=sampler)
    epoch_times: list[float] = []
    step_times: list[tuple[int, float]] = []
    step = 0
    for epoch in range(args.epochs):
        start = time.perf_counter()
        sampler.set_epoch(epoch)
        for x, y in loader:
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            if rank == 0 and step % 10 == 0:
                step_times.append((step, time.time()))
        if rank == 0:
            with torch.no_grad():
                m = model.module if args.world > 1 else model
                nn.functional.mse_loss(m(val.tensors[0]), val.tensors[1]).item()
        epoch_times.append(time.perf_counter() - start)
    if rank == 0:
        out.put({"epoch_times": epoch_times, "step_times": step_times})
    if args.world > 1:
        dist.barrier()
        dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--world", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--samples", type=int, default=65536)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fetch", choices=["per-sample", "batched"], default="per-sample")
    args = parser.parse_args()
    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    if args.world == 1:
        worker(0, args, 0, out)
    else:
        mp.spawn(worker, args=(args, free_port(), out), nprocs=args.world)
    json.dump(out.get(), sys.stdout)


if __name__ == "__main__":
    main()
