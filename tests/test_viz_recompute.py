"""toolkit.viz.recompute and its explorer: the numbers drawn equal toolkit.memory, toolkit.flops
and Chen's model; the best segment of a transformer is every layer; the explorer redraws."""

from __future__ import annotations

import pytest

from toolkit import memory
from toolkit.flops import flops_per_token
from toolkit.models import GPTConfig
from toolkit.recompute import chen_memory
from toolkit.viz.recompute import recompute_tradeoff, recompute_view
from toolkit.widgets.recompute import recompute_explorer


@pytest.mark.parametrize("model, s, b", [("gpt3-175b", 2048, 1), ("gpt2-xl", 1024, 4),
                                         ("zero-7.5b", 8192, 2)])
def test_tradeoff_numbers_follow_the_models(model, s, b):
    shape = memory.model_shape(model)
    L, h, a = shape.layers, shape.hidden, shape.heads
    t = recompute_tradeoff(model=model, seq_len=s, batch=b)
    sbh = s * b * h
    assert t["act"] == pytest.approx(sbh * (34 + 5 * a * s / h)) and t["input"] == 2 * sbh
    assert t["memory"]["none"] == pytest.approx(L * t["act"])
    assert t["memory"]["flash"] == pytest.approx(L * 34 * sbh)
    assert t["memory"]["selective"] == pytest.approx(L * 34 * sbh + 5 * a * s * s * b)
    for k in (1, 2, L):
        assert t["segments"][k] == chen_memory(L, k, input_bytes=2 * sbh, block_bytes=t["act"])
    # A layer keeps far more than its input: the best segment is one layer, not √L.
    assert t["best"] == 1 and t["sqrt_rule"] < 1.5
    cfg = GPTConfig(vocab_size=shape.vocab, seq_len=max(s, shape.seq_len), d_model=h, n_head=a,
                    n_layer=L)
    per_token = flops_per_token(cfg, seq_len=s)
    assert t["extra"]["selective"] == pytest.approx(4 * L * h * s / per_token)
    assert t["extra"]["flash"] == pytest.approx(t["extra"]["selective"] / 2)
    assert 0.3 < t["extra"]["segments"] < 0.34  # one more forward: about a third
    fig, verdict = recompute_view(model=model, seq_len=s, batch=b)
    assert "k = 1" in verdict and len(fig.data) == 9


def test_korthikanti_overhead_is_relative_to_the_forward():
    # Korthikanti et al. 2022 quote 2.7 % (GPT-3) and 1.6 % (MT-NLG) extra FLOPs for selective
    # recomputation: of the forward pass (a third of the step), s/6h / (1 + s/6h).
    t = recompute_tradeoff(model="gpt3-175b", seq_len=2048, batch=1)
    assert round(100 * 3 * t["extra"]["selective"], 1) == pytest.approx(2.7, abs=0.05)


def test_explorer_redraws_and_rejects_unknown_models():
    explorer = recompute_explorer("gpt2-xl", seq_len=1024, batch=1)
    before = explorer.verdict.value
    explorer.controls["batch"].value = 8
    assert explorer.verdict.value != before and "gpt2-xl" in explorer.figure.layout.title.text
    with pytest.raises(ValueError, match="model must be one of"):
        recompute_explorer("gpt5")
    with pytest.raises(ValueError, match="batch must be an int"):
        recompute_tradeoff(model="gpt2-xl", seq_len=1024, batch=0)
