"""toolkit.recompute: checkpointing keeps gradients bit for bit and saves the memory Chen et al.'s
model says, to the byte, from measured per-block sizes."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from toolkit.models import GPTConfig, TinyGPT, TinyMLP, make_token_data
from toolkit.recompute import (
    CheckpointedGPT, best_every, chen_memory, measure, saved_bytes, segment_sizes,
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
