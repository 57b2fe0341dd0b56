"""toolkit.recompute: checkpointing keeps gradients bit for bit and saves the memory Chen et al.'s
model says, to the byte, from measured per-block sizes; selective recomputation and a
flash-style kernel drop exactly the attention scores; the sweep on ranks agrees with one rank."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from toolkit.flops import count_flops
from toolkit.models import GPTConfig, TinyGPT, TinyMLP, make_regression_data, make_token_data
from toolkit.experiments.recompute import sweep
from toolkit.recompute import (
    CheckpointedGPT, CheckpointedMLP, best_every, checkpointed, chen_memory, measure, saved_bytes,
    segment_sizes,
)

CFG = GPTConfig(vocab_size=32, seq_len=16, d_model=32, n_head=4, n_layer=6)
B = 4


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    # Tiny ops on a shared 2-core machine: thread hand-offs cost more than the work.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def runs(one_thread) -> dict:
    model = TinyGPT(CFG)
    x, y = make_token_data(B, CFG.seq_len, CFG.vocab_size)
    return {every: measure(model, x, y, every=every, repeats=1) for every in (None, 1, 2, 4, 6)}


def test_gradients_and_loss_identical(runs: dict) -> None:
    plain = runs[None].grads
    for every, run in runs.items():
        assert run.grads.keys() == plain.keys()
        for name, g in run.grads.items():  # the same arithmetic again: equal, not just close
            assert torch.equal(g, plain[name]), (every, name)
    model = TinyGPT(CFG)
    x, y = make_token_data(B, CFG.seq_len, CFG.vocab_size)
    ref_logits, ref_loss = model(x, y)
    logits, loss = CheckpointedGPT(model, every=4)(x, y)  # segments of 4 and 2
    assert torch.equal(logits, ref_logits) and torch.equal(loss, ref_loss)
    assert CheckpointedGPT(model, every=4)(x)[1] is None
    # The wrapper shares the parameters, it does not copy them.
    assert next(CheckpointedGPT(model).parameters()) is next(model.parameters())


def test_saved_bytes_follow_chen_model_exactly(runs: dict) -> None:
    act = B * CFG.seq_len * CFG.d_model * 4  # one block's input, float32 (b, s, h)
    # Fewer segments, fewer kept inputs: exactly one (b, s, h) tensor per segment.
    for k1, k2 in ((1, 2), (2, 4), (4, 6)):
        n1, n2 = len(segment_sizes(CFG.n_layer, k1)), len(segment_sizes(CFG.n_layer, k2))
        assert runs[k1].saved_bytes - runs[k2].saved_bytes == (n1 - n2) * act
    # A segment of k blocks rerun in backward saves k blocks' internals (and k - 1 inputs).
    inner = runs[1].segment_bytes
    for k in (2, 4, 6):
        assert runs[k].segment_bytes == k * inner + (k - 1) * act
    # Outside the blocks (embeddings, head, loss): what one segment of all 6 keeps, minus its input.
    outside = runs[6].saved_bytes - act
    assert runs[None].saved_bytes == outside + CFG.n_layer * (inner + act)
    for k in (1, 2, 4, 6):  # Chen's peak: inputs held + one segment rerun
        model = chen_memory(CFG.n_layer, k, input_bytes=act, block_bytes=inner + act)
        assert runs[k].peak_bytes == outside + model - act
    # Checkpointing every block keeps far less than not checkpointing at all.
    assert runs[1].peak_bytes < runs[None].peak_bytes / 4
    assert runs[None].segment_bytes == 0


def test_sqrt_rule_and_helpers() -> None:
    assert segment_sizes(6, 4) == [4, 2] and segment_sizes(6, None) == []
    assert chen_memory(16, 4) == 8 and chen_memory(16, None) == 16
    assert best_every(16) == 4 and best_every(100) == 10 and best_every(10) == 3  # √L
    # Inputs 1/16 of a block's internals: best near √(L/16).
    assert best_every(64, input_bytes=1, block_bytes=16) == 2
    # √L memory grows like √L: 4x the layers, 2x the memory.
    assert chen_memory(64, best_every(64)) == 2 * chen_memory(16, best_every(16))
    with pytest.raises(ValueError, match="every must be None"):
        segment_sizes(4, 0)
    with pytest.raises(ValueError, match="n_layer"):
        best_every(0)
    with pytest.raises(TypeError, match="TinyGPT"):
        CheckpointedGPT(TinyMLP())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="exceeds cfg.seq_len"):
        CheckpointedGPT(TinyGPT(CFG))(torch.zeros(1, CFG.seq_len + 1, dtype=torch.long))
    # saved_bytes counts a storage once and leaves excluded tensors out.
    lin = nn.Linear(8, 8)
    x = torch.randn(3, 8, requires_grad=True)
    _, n = saved_bytes(lambda: lin(x).relu(), exclude=list(lin.parameters()))
    assert n == x.numel() * 4 + 3 * 8 * 4  # the input (for the weight's gradient) + relu's out


def test_chain_mlp_follows_chen_to_the_byte_and_the_optimum_is_sqrt_l() -> None:
    L, H, N = 16, 24, 5
    mlp = TinyMLP(d_in=H, d_hidden=H, d_out=H, depth=L)
    x, y = make_regression_data(N, H, H)
    act = N * H * 4  # one (b, h) float32 activation: a block's input, and what it keeps (c)
    plain = measure(mlp, x, y, every=None, repeats=1)
    # Every block keeps its ReLU's output; the first Linear keeps x; the loss keeps out and y.
    assert plain.peak_bytes == (L + 1) * act + 2 * act
    peaks = {}
    for k in range(1, L + 1):
        run = measure(mlp, x, y, every=k, repeats=1)
        assert run.peak_bytes == chen_memory(L, k, input_bytes=act, block_bytes=act) + 2 * act
        assert all(torch.equal(run.grads[n], plain.grads[n]) for n in plain.grads)
        peaks[k] = run.peak_bytes
    assert min(peaks, key=peaks.get) == best_every(L) == 4  # √16
    with pytest.raises(ValueError, match="depth >= 1"):
        CheckpointedMLP(TinyMLP(depth=0))


def test_selective_and_flash_drop_exactly_the_scores() -> None:
    model = TinyGPT(CFG)
    x, y = make_token_data(B, CFG.seq_len, CFG.vocab_size)
    s, a, L = CFG.seq_len, CFG.n_head, CFG.n_layer
    plain = measure(model, x, y, every=None, repeats=1)
    sel = measure(model, x, y, every=None, selective=True, repeats=1)
    flash = measure(model, x, y, every=None, attention="flash", repeats=1)
    scores = B * a * s * s * 4 + s * s  # fp32 softmax output + the (s, s) bool causal mask
    assert plain.saved_bytes - sel.saved_bytes == L * scores
    # The flash-style kernel keeps one fp32 log-sum-exp per query and head instead.
    assert plain.saved_bytes - flash.saved_bytes == L * (scores - B * a * s * 4)
    for name, g in plain.grads.items():
        assert torch.equal(sel.grads[name], g)
        torch.testing.assert_close(flash.grads[name], g, rtol=1e-5, atol=1e-6)
    # Selective recomputation reruns q·kᵀ (the softmax's input); PyTorch's non-reentrant
    # checkpoint stops once every saved tensor is back, so ·v is not rerun: 2·L·h·s per token.
    extra = {}
    for case in ({}, {"selective": True}):
        ck = checkpointed(model, every=None, **case)

        def step(ck=ck) -> None:
            model.zero_grad(set_to_none=True)
            ck(x, y)[1].backward()
        extra[bool(case)] = count_flops(step)
    assert extra[True] - extra[False] == 2 * L * CFG.d_model * s * (B * s)
    with pytest.raises(ValueError, match="choose one"):
        CheckpointedGPT(model, every=None, selective=True, attention="flash")
    with pytest.raises(ValueError, match="TinyGPT only"):
        checkpointed(TinyMLP(), every=1, selective=True)


@pytest.mark.multirank
def test_sweep_on_two_ranks_agrees_with_measure() -> None:
    L, H, N = 6, 16, 4
    mlp = TinyMLP(d_in=H, d_hidden=H, d_out=H, depth=L)
    x, y = make_regression_data(N, H, H)
    table = sweep(mlp, x, y, [{"every": None}, {"every": 2}, {"every": 3}], world_size=2,
                  repeats=1, flops=("none", "every 2"), timeout=60)
    assert table.flops.isna().tolist() == [False, False, True]  # counted where asked only
    assert list(table.index) == ["none", "every 2", "every 3"]
    for k in (2, 3):
        assert table.loc[f"every {k}", "peak"] == measure(mlp, x, y, every=k, repeats=1).peak_bytes
    assert (table.grad_diff == 0).all() and (table.step_s > 0).all()
    # Checkpointing adds one forward but the output Linear's (the rerun stops at the last saved
    # tensor): L more (N, H) @ (H, H) matmuls of 2·N·H·H FLOPs.
    assert table.loc["every 2", "flops"] - table.loc["none", "flops"] == L * 2 * N * H * H
