"""The training loop's batches: whole-batch fetch for tensors, the same batches as ever."""

from __future__ import annotations

from typing import Any
from unittest.mock import patch

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, TensorDataset

from workers.ranks.training import ResumableSampler, batches


def _usual(dataset: Dataset[Any], batch_size: int, sampler: Any = None) -> list[Any]:
    """What a plain DataLoader gives: a dataset[i] per sample, stacked per batch."""
    return list(DataLoader(dataset, batch_size=batch_size, sampler=sampler))


def _same(got: list[Any], want: list[Any]) -> bool:
    return len(got) == len(want) and all(
        len(g) == len(w) and all(torch.equal(a, b) for a, b in zip(g, w, strict=True))
        for g, w in zip(got, want, strict=True)
    )


def test_a_tensor_dataset_gives_the_usual_batches_bit_for_bit() -> None:
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(1000, 3, generator=g), torch.randint(0, 9, (1000,)))
    # In order, with a last short batch.
    assert _same(list(batches(data, 64)), _usual(data, 64))
    # Shuffled and sharded for rank 1 of 3 (DistributedSampler pads with repeats).
    for epoch in (0, 1):
        inner = DistributedSampler(data, num_replicas=3, rank=1, shuffle=True, seed=7)
        resumable = ResumableSampler(inner)
        resumable.set_epoch(epoch, skip=2 * 32)  # resumed after two batches
        want = _usual(data, 32, resumable)
        resumable.set_epoch(epoch, skip=2 * 32)
        got = list(batches(data, 32, resumable))
        assert len(got) == len(want) == 9  # 334 samples from the 3rd batch on: 270
        assert _same(got, want)


def test_a_tensor_dataset_is_indexed_once_per_batch() -> None:
    data = TensorDataset(torch.arange(100.0).reshape(50, 2))
    real = TensorDataset.__getitem__
    with patch.object(TensorDataset, "__getitem__", autospec=True, side_effect=real) as fetch:
        got = list(batches(data, 10))
    assert [len(call.args[1]) for call in fetch.call_args_list] == [10] * 5  # a list each
    assert _same(got, _usual(data, 10))


def test_other_datasets_are_fetched_the_usual_way() -> None:
    class Doubled(TensorDataset):  # a subclass may index its own way: not batched
        def __getitem__(self, index: int) -> Any:
            return tuple(2 * t for t in super().__getitem__(index))

    data = Doubled(torch.arange(30.0).reshape(15, 2))
    got = list(batches(data, 4))
    assert _same(got, _usual(data, 4))
    assert torch.equal(got[0][0], 2 * torch.arange(8.0).reshape(4, 2))
