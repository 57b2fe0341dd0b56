"""`toolkit.comm.flat`: the flat all-gather and reduce-scatter the toolkit's algorithms call.
On 2 gloo ranks: the values, one recorded event each under the name every torch in range has
(torch 2.13's rename to *_single is not recorded twice), and no warning from the rename, as a
rank running ZeRO or FSDP shows (its output reaches a notebook)."""

from __future__ import annotations

import warnings

import pytest
import torch

from toolkit import comm
from toolkit.comm.flat import gather_into, reduce_scatter_into
from toolkit.data_parallel.zero import ShardedOptimizer
from toolkit.launch import spawn

pytestmark = pytest.mark.multirank


def flat_calls(rank, world_size):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gathered = torch.zeros(2 * world_size)
        summed = torch.zeros(2)
        with comm.recording() as trace:
            gather_into(gathered, torch.full((2,), float(rank)))
            work = reduce_scatter_into(summed, torch.arange(2.0 * world_size) + rank,
                                       async_op=True)
            work.wait()
        model = torch.nn.Linear(4, 2)
        opt = ShardedOptimizer(model.parameters(), torch.optim.SGD, stage=2, lr=0.1)
        model(torch.ones(3, 4)).sum().backward()
        opt.step()
    return (gathered.tolist(), summed.tolist(), [(e.op, e.nbytes) for e in trace],
            [str(w.message) for w in caught if issubclass(w.category, FutureWarning)])


def test_flat_collectives_record_one_name_and_warn_nothing():
    for rank, (gathered, summed, events, future) in enumerate(spawn(flat_calls, 2, timeout=60)):
        assert gathered == [0.0, 0.0, 1.0, 1.0]
        # rank r keeps slice r of Σ_q (arange(4) + q) = 2·arange(4) + 1
        assert summed == [2.0 * (2 * rank + i) + 1 for i in range(2)]
        assert events == [("all_gather_into_tensor", 8), ("reduce_scatter_tensor", 16)]
        assert future == []
