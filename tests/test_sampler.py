"""`shard_indices` deals samples out exactly as torch's DistributedSampler does (the sampler
PyTorch Lightning injects), for sizes that do and do not divide, with and without shuffling and
drop_last, over epochs; and it rejects bad arguments saying which."""

from __future__ import annotations

import pytest
from torch.utils.data import DistributedSampler

from toolkit.data_parallel.sampler import samples_per_rank, shard_indices


@pytest.mark.parametrize("n", [1, 5, 8, 13, 64])
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("drop_last", [False, True])
def test_equals_torchs_distributed_sampler(n, world_size, shuffle, drop_last):
    if drop_last and n < world_size:
        pytest.skip("torch's sampler yields nothing here; shard_indices refuses (tested below)")
    for epoch in (0, 1, 5):
        for rank in range(world_size):
            torch_sampler = DistributedSampler(range(n), world_size, rank, shuffle=shuffle,
                                               seed=7, drop_last=drop_last)
            torch_sampler.set_epoch(epoch)
            mine = shard_indices(n, rank=rank, world_size=world_size, epoch=epoch, seed=7,
                                 shuffle=shuffle, drop_last=drop_last)
            assert mine == list(torch_sampler)
            assert len(mine) == samples_per_rank(n, world_size, drop_last=drop_last)


def test_ranks_cover_every_sample_and_epochs_reshuffle():
    n, p = 13, 4  # not divisible: 16 slots, the first 3 samples of the order appear twice
    dealt = [i for r in range(p) for i in shard_indices(n, rank=r, world_size=p)]
    assert sorted(set(dealt)) == list(range(n)) and len(dealt) == 16
    assert shard_indices(n, rank=0, world_size=p, epoch=0) != shard_indices(
        n, rank=0, world_size=p, epoch=1)
    assert shard_indices(8, rank=1, world_size=2, shuffle=False) == [1, 3, 5, 7]


@pytest.mark.parametrize("kwargs, message", [
    (dict(rank=2, world_size=2), "rank"),
    (dict(rank=0, world_size=0), "world_size"),
    (dict(rank=0, world_size=2, epoch=-1), "epoch"),
])
def test_bad_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        shard_indices(8, **kwargs)


def test_drop_last_with_fewer_samples_than_ranks_says_what_to_do():
    with pytest.raises(ValueError, match="drop_last=False"):
        samples_per_rank(3, 4, drop_last=True)
