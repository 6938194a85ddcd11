"""PyTorch's multi-GPU DDP tutorial (multigpu.py), completed with a real model and data:
the script starts its own ranks with mp.spawn and calls init_process_group itself.

On Trainyard run it as one process that holds the job's devices (strategy "dp"): it
finds MASTER_ADDR and a free MASTER_PORT on loopback set. It trains on every GPU it
sees (nccl), or on CPU with gloo and $TRAINYARD_DEVICES processes (2 outside Trainyard).
"""

import argparse
import os
import sys

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

try:
    import trainyard_job
except ImportError:
    trainyard_job = None


def ddp_setup(rank: int, world_size: int) -> None:
    os.environ.setdefault("MASTER_ADDR", "localhost")  # the tutorial sets these two
    os.environ.setdefault("MASTER_PORT", "12355")
    if torch.cuda.is_available():
        torch.cuda.set_device(rank)
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend=backend, rank=rank, world_size=world_size)


class Trainer:
    def __init__(self, model: nn.Module, data: DataLoader, rank: int, epochs: int) -> None:
        self.rank = rank
        self.device = torch.device(f"cuda:{rank}" if torch.cuda.is_available() else "cpu")
        ids = [rank] if torch.cuda.is_available() else None
        self.model = DDP(model.to(self.device), device_ids=ids)
        self.data = data
        self.epochs = epochs
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)

    def train(self) -> None:
        step = 0
        for epoch in range(self.epochs):
            assert isinstance(self.data.sampler, DistributedSampler)
            self.data.sampler.set_epoch(epoch)
            for x, y in self.data:
                x, y = x.to(self.device), y.to(self.device)
                loss = nn.functional.cross_entropy(self.model(x), y)
                self.optimizer.zero_grad()
                loss.backward()
                self.optimizer.step()
                step += 1
            print(
                f"[GPU{self.rank}] Epoch {epoch} | Batchsize: {self.data.batch_size} "
                f"| Steps: {len(self.data)} | loss {loss.item():.4f}"
            )
            if self.rank == 0 and trainyard_job:
                trainyard_job.report(
                    step, epoch=epoch + 1, epochs=self.epochs,
                    total_steps=self.epochs * len(self.data), **{"train/loss": loss.item()},
                )  # fmt: skip
        if self.rank == 0:
            out = os.environ.get("TRAINYARD_OUTPUT_DIR", ".")
            torch.save(self.model.module.state_dict(), os.path.join(out, "model.pt"))


def main(rank: int, world_size: int, epochs: int, batch_size: int, path: str) -> None:
    ddp_setup(rank, world_size)
    torch.manual_seed(0)
    data = np.load(path)
    dataset = TensorDataset(
        torch.from_numpy(data["images"]).flatten(1), torch.from_numpy(data["target"]).long()
    )
    loader = DataLoader(dataset, batch_size=batch_size, sampler=DistributedSampler(dataset))
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    Trainer(model, loader, rank, epochs).train()
    dist.barrier()  # every rank done before the group goes (gloo's teardown, issue seen)
    dist.destroy_process_group()
    # Leave without the interpreter's teardown, where a gloo rank on CPU still aborts
    # now and then ("terminate called without an active exception"): rank 0's model is
    # saved, output is flushed here, and mp.spawn reads exit status 0 as success.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="simple distributed training job")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32)
    inputs = os.environ.get("TRAINYARD_INPUT_DIR", ".")
    parser.add_argument("--data", default=os.path.join(inputs, "digits.npz"))
    args = parser.parse_args()
    world_size = torch.cuda.device_count() or int(os.environ.get("TRAINYARD_DEVICES", "2"))
    mp.spawn(main, args=(world_size, args.epochs, args.batch_size, args.data), nprocs=world_size)
