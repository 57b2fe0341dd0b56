"""Dynamic device check: the single-process paths of the rank-side code, run on the device
they are handed.

Each test builds its inputs on `device` and asserts that every tensor the code under test makes
(buffers, shards, masks, outputs, gradients) is on that device too. ``cpu`` is where the values
are checked; ``meta`` is a second device that this machine has (shapes and dtypes, no data), so
code that creates a tensor without asking its inputs where (``torch.zeros(n)``) fails here, as
it would on a GPU rank. Multi-rank paths need a backend for the device: those run on gloo in
the other tests and on NCCL in tests/test_gpu.py.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from toolkit.collectives import chunk_sizes
from toolkit.collectives._common import flat_view
from toolkit.context_parallel import full_attention, ring_attention, ulysses_attention
from toolkit.data_parallel.accumulation import accumulate_gradients, split_batch
from toolkit.data_parallel.buckets import Bucket, assign_buckets
from toolkit.data_parallel.fsdp import FlatGroup
from toolkit.data_parallel.units import ParamInfo
from toolkit.data_parallel.zero import FlatShard
from toolkit.experiments.collectives import _buffers, _elements, _runner
from toolkit.models import GPTConfig, TinyGPT, TinyMLP, make_regression_data, make_token_data
from toolkit.pipeline.stage import _shapes
from toolkit.pipeline.work import delay_blocks
from toolkit.recompute import CheckpointedGPT
from toolkit.tensor_parallel import (
    ColumnParallelLinear, ParallelMLP, ParallelSelfAttention, RowParallelLinear,
)

DEVICES = ["cpu", "meta"]
CFG = GPTConfig(vocab_size=17, seq_len=8, d_model=12, n_head=2, n_layer=2)  # tied head


def _on(device: str, *tensors: torch.Tensor | None) -> None:
    """Every tensor given lives on `device`."""
    for t in tensors:
        if t is not None:
            assert t.device.type == device, f"a tensor on {t.device}, expected {device}"


@pytest.fixture(params=DEVICES)
def device(request) -> str:
    return request.param


def test_models_and_data_are_built_where_asked(device):
    mlp = TinyMLP(d_in=5, d_hidden=7, d_out=3, depth=2, seed=1, device=device)
    gpt = TinyGPT(CFG, device=device)
    _on(device, *mlp.parameters(), *gpt.parameters())
    assert gpt.lm_head.weight is gpt.tok_emb.weight  # moving kept the tie
    x, y = make_regression_data(6, 5, 3, seed=2, device=device)
    idx, tgt = make_token_data(4, CFG.seq_len, CFG.vocab_size, device=device)
    _on(device, x, y, idx, tgt)
    out = mlp(x)
    logits, loss = gpt(idx, tgt)
    _on(device, out, logits, loss)
    assert out.shape == (6, 3) and logits.shape == (4, CFG.seq_len, CFG.vocab_size)
    if device == "cpu":  # the same numbers as a model built without device=
        ref = TinyMLP(d_in=5, d_hidden=7, d_out=3, depth=2, seed=1)
        assert all(torch.equal(a, b) for a, b in zip(mlp.parameters(), ref.parameters()))
        assert torch.equal(x, make_regression_data(6, 5, 3, seed=2)[0])


def test_flat_shard_keeps_parameters_on_their_device(device):
    # ZeRO-1/2's flat buffer: the parameters become views of it, so it must be on their device
    # (on NCCL, p.data = flat[...] would otherwise move CUDA parameters to the CPU).
    model = TinyMLP(d_in=7, d_hidden=10, d_out=3, seed=0, device=device)  # 223: not 3 | n
    params = list(model.parameters())
    shapes = [p.shape for p in params]
    flat = FlatShard(params, world_size=3, rank=1)
    _on(device, flat.flat, *model.parameters(), flat.local(flat.flat))
    assert flat.shard_numel == 75 and flat.padding == 2 and flat.bounds == (75, 150)
    assert [p.shape for p in model.parameters()] == shapes
    assert all(p.untyped_storage().data_ptr() == flat.flat.untyped_storage().data_ptr()
               for p in model.parameters()) or device == "meta"  # meta has no storage address
    if device == "cpu":
        ref = TinyMLP(d_in=7, d_hidden=10, d_out=3, seed=0)
        assert all(torch.equal(a, b) for a, b in zip(model.parameters(), ref.parameters()))


def test_fsdp_flat_group_shard_and_buffer_on_the_parameters_device(device):
    model = TinyMLP(d_in=7, d_hidden=10, d_out=3, seed=0, device=device)
    entries = [ParamInfo(p, n, [(model.layers[0], "weight")]) for n, p in model.named_parameters()]
    group = FlatGroup(entries, trainable=True, world_size=4, rank=2, compute_dtype=None,
                      group=None)
    _on(device, group.shard, group.full)
    assert group.shard.shape == (56,) and group.full.shape == (224,)  # ⌈223/4⌉ = 56
    assert not group.gathered  # freed at construction: storage resized to 0
    if device == "cpu":
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        assert torch.equal(group.shard.detach(), flat[112:168])


def test_buckets_pack_and_unpack_on_the_gradients_device(device):
    params = [nn.Parameter(torch.ones(n, device=device)) for n in (100, 100, 300)]
    assert assign_buckets(params, cap_bytes=1000) == [[2], [1, 0]]
    bucket = Bucket(0, params[:2])
    params[0].grad = torch.full((100,), 2.0, device=device)
    bucket.pack_missing()  # params[1] has no gradient: zeros
    _on(device, bucket.buffer)
    bucket.unpack()
    _on(device, params[0].grad, params[1].grad)
    if device == "cpu":
        assert params[0].grad.sum().item() == 200 and params[1].grad.sum().item() == 0


def test_accumulation_returns_the_loss_on_the_data_device(device):
    model = TinyMLP(seed=0, device=device)
    x, y = make_regression_data(12, 8, 4, device=device)
    pieces = split_batch(x, y, micro_batches=5)
    _on(device, *(t for mb in pieces for t in mb))
    loss = accumulate_gradients(model, pieces, lambda m, xb, yb: F.mse_loss(m(xb), yb))
    _on(device, loss, *(p.grad for p in model.parameters()))
    if device == "cpu":
        assert torch.allclose(loss, F.mse_loss(TinyMLP(seed=0)(x), y), atol=1e-6)


def test_tensor_parallel_layers_on_one_rank(device):
    # Without a process group the parallel layers are their dense twins (group size 1).
    col = ColumnParallelLinear(6, 4, device=device)
    row = RowParallelLinear(4, 6, device=device)
    mlp = ParallelMLP(6, 8, device=device)
    attn = ParallelSelfAttention(6, 2, device=device)
    _on(device, *col.parameters(), *row.parameters(), *mlp.parameters(), *attn.parameters())
    x = torch.randn(2, 5, 6, device=device, requires_grad=True)
    y = row(col(x)) + mlp(x) + attn(x)
    y.sum().backward()
    _on(device, y, x.grad)
    dense = TinyGPT(CFG, device=device).blocks[0]
    _on(device, *ParallelMLP.from_dense(dense.mlp).parameters(),
        *ParallelSelfAttention.from_dense(dense.attn).parameters())
    if device == "cpu":  # the device= path draws the same weights as the default one
        assert torch.equal(col.weight, ColumnParallelLinear(6, 4).weight)


def test_attention_masks_and_accumulators_on_the_inputs_device(device):
    q, k, v = (torch.randn(1, 2, 6, 4, device=device, requires_grad=True) for _ in range(3))
    full = full_attention(q, k, v)
    ring = ring_attention(q, k, v)  # one rank: the ring is the diagonal block alone
    ulysses = ulysses_attention(q, k, v)
    (full.sum() + ring.sum() + ulysses.sum()).backward()
    _on(device, full, ring, ulysses, q.grad, k.grad, v.grad)
    if device == "cpu":
        assert torch.allclose(ring, full, atol=1e-6) and torch.allclose(ulysses, full, atol=1e-6)


def test_recompute_and_pipeline_shapes_on_the_data_device(device):
    model = TinyGPT(CFG, device=device)
    idx, tgt = make_token_data(2, CFG.seq_len, CFG.vocab_size, device=device)
    _, loss = CheckpointedGPT(model, every=1)(idx, tgt)
    loss.backward()
    _on(device, loss, *(p.grad for p in model.parameters()))
    layers = [b.to(device) for b in delay_blocks(3, width=4, forward=0.0, backward=0.0)]
    micro = list(torch.randn(5, 4, device=device).tensor_split(2))
    shapes = _shapes(layers, [range(0, 2), range(2, 3)], micro)
    assert shapes[0, 0] == (torch.Size((3, 4)), torch.float32)
    assert shapes[1, 1] == (torch.Size((2, 4)), torch.float32)


def test_sweep_buffers_and_chunking_on_the_device_asked(device):
    for collective in ("all_reduce", "scatter"):
        b = _buffers(collective, 1024, 4, 0, torch.float32, torch.device(device))
        buffers = [t for t in (b["full"], b["piece"], *(b["pieces"] or [])) if t is not None]
        assert len(buffers) == (2 if collective == "all_reduce" else 6)
        _on(device, *buffers)
        assert callable(_runner(collective, "torch", b))
    assert _elements(4096, torch.float16, 4, "all_gather") == 2048
    flat, copied = flat_view(torch.empty(3, 4, device=device).t())
    _on(device, flat)
    assert copied and flat.shape == (12,) and chunk_sizes(12, 5) == [3, 3, 2, 2, 2]
