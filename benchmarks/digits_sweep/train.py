"""An MLP on the 8x8 handwritten digits, for the sweep benchmark: one trial of its grid.

    python train.py --lr 0.03 --width 64 --batch-size 32 --epochs 9 [--passes 16]

It reports val/accuracy and val/loss after every epoch to $TRAINYARD_METRICS_FILE (JSON
lines with "epoch" and "step"); outside Trainyard it prints them. An epoch is ``--passes``
passes over the 1,500 training images, so that an epoch's training, not the
interpreter's start, is most of a trial's time, as in a real sweep. The seed is fixed:
the same values train the same model in every sweep.
"""

import argparse
import json
import os
import time

import numpy as np
import torch
from torch import nn

TRAIN = 1500  # the first 1,500 images train, the other 297 validate


def main() -> None:
    parser = argparse.ArgumentParser()
    inputs = os.environ.get("TRAINYARD_INPUT_DIR", ".")
    parser.add_argument("--data", default=os.path.join(inputs, "digits.npz"))
    parser.add_argument("--lr", type=float, required=True)
    parser.add_argument("--width", type=int, required=True)
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--epochs", type=int, default=9)
    parser.add_argument("--passes", type=int, default=16, help="Passes over the data per epoch.")
    args = parser.parse_args()
    torch.manual_seed(0)

    data = np.load(args.data)
    x = torch.from_numpy(data["images"]).flatten(1)
    y = torch.from_numpy(data["target"]).long()
    x_train, y_train, x_val, y_val = x[:TRAIN], y[:TRAIN], x[TRAIN:], y[TRAIN:]
    model = nn.Sequential(
        nn.Linear(64, args.width), nn.ReLU(),
        nn.Linear(args.width, args.width), nn.ReLU(),
        nn.Linear(args.width, 10),
    )  # fmt: skip
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    steps_per_epoch = args.passes * -(-TRAIN // args.batch_size)
    metrics = os.environ.get("TRAINYARD_METRICS_FILE")

    step = 0
    for epoch in range(1, args.epochs + 1):
        model.train()
        for _ in range(args.passes):
            order = torch.randperm(TRAIN)
            for i in range(0, TRAIN, args.batch_size):
                batch = order[i : i + args.batch_size]
                loss = nn.functional.cross_entropy(model(x_train[batch]), y_train[batch])
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                step += 1
        model.eval()
        with torch.no_grad():
            out = model(x_val)
            val_loss = nn.functional.cross_entropy(out, y_val).item()
            accuracy = (out.argmax(1) == y_val).float().mean().item()
        line = {
            "step": step, "epoch": epoch, "epochs": args.epochs,
            "total_steps": args.epochs * steps_per_epoch,
            "val/accuracy": accuracy, "val/loss": val_loss,
        }  # fmt: skip
        if metrics:
            with open(metrics, "a") as f:
                f.write(json.dumps(line) + "\n")
        else:
            print(json.dumps(line), flush=True)
        if epoch == 1:  # the script's own clock (the runner reads the file every 0.5 s)
            print("first-point", time.time(), flush=True)


if __name__ == "__main__":
    main()
