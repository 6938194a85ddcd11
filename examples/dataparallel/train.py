"""PyTorch's DataParallel tutorial, completed with a real model and real data: a small
convolutional network learns the 8x8 handwritten digits.

It runs anywhere (plain `python train.py --data digits.npz`); on Trainyard its data file
is under $TRAINYARD_INPUT_DIR, and what it writes to $TRAINYARD_OUTPUT_DIR becomes the
job's artifacts. It uses every GPU it sees through nn.DataParallel, as the tutorial does.
"""

import argparse
import os

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

try:  # on Trainyard's PYTHONPATH; elsewhere the script runs without it
    import trainyard_job
except ImportError:
    trainyard_job = None


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        )  # fmt: skip
        self.fc = nn.Linear(32 * 2 * 2, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.fc(self.features(x).flatten(1))
        print("\tIn Model: input size", tuple(x.size()), "output size", tuple(out.size()))
        return out


def load(path: str) -> tuple[TensorDataset, TensorDataset]:
    data = np.load(path)
    x = torch.from_numpy(data["images"]).unsqueeze(1)
    y = torch.from_numpy(data["target"]).long()
    return TensorDataset(x[:1500], y[:1500]), TensorDataset(x[1500:], y[1500:])


def main() -> None:
    parser = argparse.ArgumentParser()
    inputs = os.environ.get("TRAINYARD_INPUT_DIR", ".")
    parser.add_argument("--data", default=os.path.join(inputs, "digits.npz"))
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=100)
    args = parser.parse_args()
    torch.manual_seed(0)

    train_set, val_set = load(args.data)
    train = DataLoader(train_set, batch_size=args.batch_size, shuffle=True)
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    model = Model()
    if torch.cuda.device_count() > 1:
        print("Let's use", torch.cuda.device_count(), "GPUs!")
        model = nn.DataParallel(model)
    model.to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)

    step = 0
    for epoch in range(args.epochs):
        for x, y in train:
            x, y = x.to(device), y.to(device)
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            print("Outside: input size", tuple(x.size()), "loss", round(loss.item(), 4))
        x, y = val_set.tensors
        with torch.no_grad():
            accuracy = (model(x.to(device)).argmax(1).cpu() == y).float().mean().item()
        print(f"epoch {epoch + 1}: val accuracy {accuracy:.3f}")
        if trainyard_job:
            total = args.epochs * len(train)
            trainyard_job.report(
                step, epoch=epoch + 1, epochs=args.epochs, total_steps=total,
                **{"train/loss": loss.item(), "val/accuracy": accuracy},
            )  # fmt: skip

    out = os.environ.get("TRAINYARD_OUTPUT_DIR", ".")
    state = model.module.state_dict() if isinstance(model, nn.DataParallel) else model.state_dict()
    torch.save(state, os.path.join(out, "model.pt"))


if __name__ == "__main__":
    main()
