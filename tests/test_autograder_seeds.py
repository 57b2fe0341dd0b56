"""Per-rank inputs of every lab come from independent hashed streams (`autograder.seeds`; issue
19, pass 3, for labs 05-07; issue 30 for labs 01-03, which used ``seed·1009 + rank``,
``1000·seed + rank`` and ``7 + seed``): one rank's inputs reveal no other rank's, and a rank
of lab 05's MLP or of lab 07's layer holds only its own shard or experts."""

from __future__ import annotations

import pytest
import torch

from autograder.lab import find_lab, load_lab
from autograder.seeds import generator, stream_seed

SEED = (1 << 39) + 12345  # a 40-bit case seed, as grade.case_seed draws them


def test_streams_are_independent_of_each_other_and_use_every_bit_of_the_seed():
    seeds = {stream_seed(SEED, "rank", r) for r in range(4)} | {stream_seed(SEED, "shared")}
    assert len(seeds) == 5 and all(0 <= s < 1 << 64 for s in seeds)
    # No fixed offset between ranks (the old seed·7919 + 101 + r).
    assert len({stream_seed(SEED, "rank", r + 1) - stream_seed(SEED, "rank", r)
                for r in range(3)}) == 3
    # torch keeps 32 bits of a seed; the case seed's higher bits still change every stream.
    low = SEED & 0xFFFFFFFF
    a, b = torch.randn(4, generator=generator(SEED, "rank", 0)), \
        torch.randn(4, generator=generator(low, "rank", 0))
    assert not torch.equal(a, b)
    assert torch.equal(a, torch.randn(4, generator=generator(SEED, "rank", 0)))


def test_a_bad_seed_is_named():
    with pytest.raises(ValueError, match="seed must be a non-negative int"):
        stream_seed(-1, "rank", 0)


def test_lab05_mlp_ranks_hold_only_their_shard():
    lab = load_lab(find_lab("05_tensor_parallel_mlp"), hidden=False)
    case = {"world_size": 4, "kind": "mlp", "shape": [2, 3], "h": 8, "d": 16,
            "dtype": "float64", "bias": True, "seed": SEED}
    inputs = lab.harness.make_inputs(case, 4)
    for r, i in enumerate(inputs):
        mine = slice(4 * r, 4 * r + 4)
        others = torch.ones(16, dtype=torch.bool)
        others[mine] = False
        assert i["up.weight"][mine].abs().min() > 0 and not i["up.weight"][others].any()
        assert i["up.bias"][mine].abs().min() > 0 and not i["up.bias"][others].any()
        assert i["down.weight"][:, mine].abs().min() > 0 and not i["down.weight"][:, others].any()
        for key in ("x", "gy", "down.bias"):  # whole, the same on every rank
            assert torch.equal(i[key], inputs[0][key])
    # Rank 1's shard is its own stream's draw, not rank 0's stream one step on.
    own = torch.randn(4, 8, generator=generator(SEED, "shard", 1), dtype=torch.float64)
    assert torch.allclose(inputs[1]["up.weight"][4:8], own * 8 ** -0.5)
    near = torch.Generator().manual_seed(stream_seed(SEED, "shard", 0) + 1)
    assert not torch.allclose(inputs[1]["up.weight"][4:8],
                              torch.randn(4, 8, generator=near, dtype=torch.float64) * 8 ** -0.5)


def test_lab07_ranks_hold_only_their_experts():
    lab = load_lab(find_lab("07_expert_parallel"), hidden=False)
    case = {"world_size": 2, "kind": "moe", "seed": SEED, "experts": 6, "tokens": [5, 3],
            "d": 4, "f": 6, "top_k": 2, "capacity_factor": 1.0}
    inputs = lab.harness.make_inputs(case, 2)
    shapes = {"w1": (3, 4, 6), "b1": (3, 6), "w2": (3, 6, 4), "b2": (3, 4)}
    for n, shape in shapes.items():
        assert all(tuple(i[n].shape) == shape for i in inputs)
        assert not torch.allclose(inputs[0][n], inputs[1][n])
    assert torch.equal(inputs[0]["router"], inputs[1]["router"])
    assert [len(i["x"]) for i in inputs] == [5, 3]
    # Expert 4 (rank 1's second) is drawn from its own stream.
    w1 = (2 * torch.rand(4, 6, generator=generator(SEED, "expert", 4), dtype=torch.float64)
          - 1) * 4 ** -0.5
    assert torch.equal(inputs[1]["w1"][1], w1)


def test_lab06_ranks_draw_from_their_own_streams():
    lab = load_lab(find_lab("06_mixed_precision"), hidden=False)
    case = {"world_size": 3, "kind": "reduce", "seed": SEED, "shapes": [[3, 4], [5]]}
    inputs = lab.harness.make_inputs(case, 3)
    for r, i in enumerate(inputs):  # rank r's gradients: its own stream's draws, in order
        g = generator(SEED, "rank", r)
        assert all(torch.equal(got, torch.randn(s, generator=g, dtype=torch.float64))
                   for got, s in zip(i["g"], ((3, 4), (5,))))
    # No fixed offset between ranks: rank 1's stream is not rank 0's seed plus one.
    near = torch.Generator().manual_seed(stream_seed(SEED, "rank", 0) + 1)
    assert not torch.equal(inputs[1]["g"][0], torch.randn(3, 4, generator=near,
                                                          dtype=torch.float64))
    train = {"world_size": 2, "kind": "train", "seed": SEED, "d_in": 3, "d_out": 2, "batch": 4,
             "steps": 2}
    t = lab.harness.make_inputs(train, 2)
    w0 = torch.randn(2, 3, generator=generator(SEED, "shared"), dtype=torch.float64) * 0.5
    assert torch.equal(t[0]["w0"], w0) and torch.equal(t[1]["w0"], w0)
    assert not torch.equal(t[0]["x"], t[1]["x"])


def test_labs_01_to_03_draw_from_hashed_streams():
    """Lab 01: rank r's tensor from stream ("rank", r). Lab 02: rank r's initial model from
    ("model", r), the batch from "data". Lab 03: the model from "model", the batch from "data".
    No stream is another's seed plus one (the old linear seeds)."""
    lab1 = load_lab(find_lab("01_collectives"), hidden=False)
    case = {"world_size": 3, "numel": 5, "dtype": "float64", "seed": SEED}
    xs = lab1.harness.make_inputs(case, 3)
    for r, x in enumerate(xs):
        assert torch.equal(x, torch.randn(5, generator=generator(SEED, "rank", r),
                                          dtype=torch.float64))
    near = torch.Generator().manual_seed(stream_seed(SEED, "rank", 0) + 1)
    assert not torch.equal(xs[1], torch.randn(5, generator=near, dtype=torch.float64))

    lab2 = load_lab(find_lab("02_ddp"), hidden=False)
    case = {"world_size": 2, "seed": SEED, "model": "toy", "steps": 1}
    inputs = lab2.harness.make_inputs(case, 2)
    torch.manual_seed(stream_seed(SEED, "model", 1))
    a_weight = torch.nn.Linear(7, 5).weight  # the toy's first layer, drawn first
    assert torch.equal(inputs[1]["state"]["a.weight"], a_weight.detach())
    assert not torch.equal(inputs[0]["state"]["a.weight"], inputs[1]["state"]["a.weight"])
    data = torch.randn(8, 7, generator=generator(SEED, "data"))
    assert torch.equal(torch.cat([inputs[r]["batches"][0][0] for r in range(2)]), data)
    assert not lab2.harness._stream({"world_size": 2}, "model", 0)  # a rank's case: no seed

    lab3 = load_lab(find_lab("03_sharded_optimizer"), hidden=False)
    case = {"world_size": 2, "seed": SEED, "dims": [3, 2], "frozen": []}
    inputs = lab3.harness.make_inputs(case, 2)
    torch.manual_seed(stream_seed(SEED, "model"))
    assert torch.equal(inputs[0]["state"]["0.weight"], torch.nn.Linear(3, 2).weight.detach())
    x = torch.randn(12, 3, generator=generator(SEED, "data"))
    assert torch.equal(torch.cat([inputs[r]["batch"][0] for r in range(2)]), x)
