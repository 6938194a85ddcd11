"""The script people write instead of using Trainyard: mp.spawn + DistributedSampler + DDP.

Same model, data, batch and epochs as the Trainyard job it is compared with; hand-written
loop, no reporting, validation on rank 0 each epoch. Prints one JSON line: epoch times,
and (step, time) every 10 steps, the points Trainyard records its train/loss at.

    python -m benchmarks.bare_ddp --world 2 --epochs 4 [--fetch batched] ...
    python -m benchmarks.bare_ddp --device cuda --wrap dp ...   # one GPU, DataParallel

``--fetch per-sample`` (the default) is the DataLoader as people use it: a ``dataset[i]``
per sample, stacked. ``--fetch batched`` indexes the TensorDataset a batch at a time, as
Trainyard's loop does, to compare like with like.

``--device cuda``: rank r trains on GPU r, NCCL between ranks, each batch moved to the GPU
as Trainyard's loop moves it. ``--wrap`` is how the model is wrapped, as Trainyard's
strategies wrap it: ``auto`` (DDP for more than one rank, else nothing), ``none``, ``dp``
(DataParallel, one process) or ``ddp`` (DDP, a process group even of one rank).
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


def wrapping(args: argparse.Namespace) -> str:
    """none, dp or ddp: ``--wrap``, with ``auto`` resolved."""
    if args.wrap == "auto":
        return "ddp" if args.world > 1 else "none"
    if args.wrap != "ddp" and args.world > 1:
        raise SystemExit(f"--wrap {args.wrap} trains in one process: --world 1")
    return str(args.wrap)


def worker(rank: int, args: argparse.Namespace, port: int, out: mp.SimpleQueue) -> None:  # type: ignore[type-arg]
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // args.world))
    cuda = args.device == "cuda"
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    wrap = wrapping(args)
    if wrap == "ddp":
        dist.init_process_group(
            "nccl" if cuda else "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=args.world,
            timeout=timedelta(seconds=60),
        )
    params = RegressionParams(hidden=args.hidden, layers=args.layers, train_samples=args.samples)
    train, val = _regression_data(params, args.seed)
    torch.manual_seed(args.seed)
    model: nn.Module = _regression_model(params).to(device)
    if wrap == "ddp":
        model = nn.parallel.DistributedDataParallel(model, device_ids=[rank] if cuda else None)
    elif wrap == "dp" and cuda:  # on CPU, as Trainyard's dp: the module itself
        model = nn.DataParallel(model, device_ids=[rank])
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
            if cuda:
                x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            if rank == 0 and step % 10 == 0:
                # The loss read where Trainyard's loop reads its train/loss: on a GPU the
                # time is then that of the step done, not of its kernels queued.
                loss.item()
                step_times.append((step, time.time()))
        if rank == 0:
            with torch.no_grad():
                m = getattr(model, "module", model)
                x, y = val.tensors[0].to(device), val.tensors[1].to(device)
                nn.functional.mse_loss(m(x), y).item()
        epoch_times.append(time.perf_counter() - start)
    if rank == 0:
        out.put({"epoch_times": epoch_times, "step_times": step_times})
    if wrap == "ddp":
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
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--wrap", choices=["auto", "none", "dp", "ddp"], default="auto")
    args = parser.parse_args()
    wrapping(args)  # a bad combination is refused before any rank starts
    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    if args.world == 1:
        worker(0, args, free_port(), out)
    else:
        mp.spawn(worker, args=(args, free_port(), out), nprocs=args.world)
    json.dump(out.get(), sys.stdout)


if __name__ == "__main__":
    main()
