"""Which samples each step sees: the batches, and a sampler that resumes mid-epoch.

The data order is the same whatever the strategy: every strategy draws batches
through a ``DistributedSampler`` (one replica for single/dp), so the global batch k
holds the same samples in every case and the same spec + seed ends with the same
weights.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

from torch.utils.data import (
    BatchSampler,
    DataLoader,
    Dataset,
    DistributedSampler,
    Sampler,
    TensorDataset,
)


class ResumableSampler(Sampler[int]):
    """The DistributedSampler's order for an epoch, minus the samples already trained on."""

    def __init__(self, inner: DistributedSampler[Any]) -> None:
        self.inner = inner
        self.skip = 0

    def set_epoch(self, epoch: int, skip: int = 0) -> None:
        self.inner.set_epoch(epoch)  # shuffles by seed + epoch, the same on every rank
        self.skip = skip

    def __iter__(self) -> Iterator[int]:
        return itertools.islice(iter(self.inner), self.skip, None)

    def __len__(self) -> int:
        return max(len(self.inner) - self.skip, 0)


def batches(
    dataset: Dataset[Any], batch_size: int, sampler: Sampler[int] | None = None
) -> DataLoader[Any]:
    """The dataset's batches, in the sampler's order (default: in order).

    A ``TensorDataset`` is indexed a whole batch at a time, one gather per tensor. The
    DataLoader's usual way, a ``dataset[i]`` per sample and a ``torch.stack`` per batch,
    took a third of an MLP's CPU epoch in Python (0.26 of 0.83 s, 256-sample batches).
    The batches are the same, bit for bit. Other datasets are fetched the usual way, or
    through their own ``__getitems__`` where they define one.
    """
    if type(dataset) is TensorDataset:  # a subclass may index differently
        whole = sampler if sampler is not None else range(len(dataset))
        order = BatchSampler(whole, batch_size, drop_last=False)
        return DataLoader(dataset, batch_size=None, sampler=order)
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler)
