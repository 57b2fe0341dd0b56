"""toolkit.roofline: the roofline rule, the datasheet ridges, the FLOPs and bytes of the course's
layers (FLOPs checked against what FlopCounterMode counts on TinyGPT's own modules), and the
bounds built on them; toolkit.viz.roofline's figures and the explorer on top."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from toolkit.flops import A100_BF16, H100_SXM_BF16, count_flops
from toolkit.models import GPTConfig, TinyGPT
from toolkit.roofline import (
    A100_SXM, DATASHEET_ROOFS, H100_SXM, Kernel, Roof, attainable, attention, gpt_block_kernels,
    layernorm, linear, linear_limits, mfu_bound, roofline_time, tokens_to_ridge,
)
from toolkit.viz.roofline import (
    LAYERS, layer_kernel, mfu_bound_figure, roofline_figure, roofline_view,
)
from toolkit.widgets.roofline import roofline_explorer

CFG = GPTConfig(vocab_size=64, seq_len=16, d_model=32, n_head=4, n_layer=2)
HERE = Roof("here", peak_flops=90e9, bandwidth=20e9)


def test_attainable_is_the_lower_of_slope_and_roof():
    assert attainable(1.0, peak_flops=10.0, bandwidth=2.0) == 2.0      # memory-bound: I·W
    assert attainable(100.0, peak_flops=10.0, bandwidth=2.0) == 10.0   # compute-bound: P
    roof = Roof("r", 10.0, 2.0)
    assert roof.ridge == 5.0 and roof.attainable(5.0) == 10.0 == 5.0 * 2.0


def test_datasheet_ridges():
    assert A100_SXM.peak_flops == A100_BF16 == 312e12 and A100_SXM.bandwidth == 2.039e12
    assert H100_SXM.peak_flops == H100_SXM_BF16 == 989e12 and H100_SXM.bandwidth == 3.35e12
    assert A100_SXM.ridge == pytest.approx(153.02, abs=0.01)
    assert H100_SXM.ridge == pytest.approx(295.22, abs=0.01)
    assert set(DATASHEET_ROOFS) == {"A100 SXM bf16", "H100 SXM bf16"}


def test_linear_counts_by_hand_and_tends_to_the_activation_cap():
    k = linear(1, 256, 1024)
    assert k.flops == 2 * 256 * 1024
    assert k.bytes == 4 * (256 + 256 * 1024 + 1024 + 1024)
    assert linear(1, 256, 1024, bias=False).bytes == 4 * (256 + 256 * 1024 + 1024)
    limit = 2 * 256 * 1024 / (4 * (256 + 1024))               # 102.4 FLOP/B in fp32
    intensities = [linear(t, 256, 1024).intensity for t in (1, 16, 256, 4096, 1 << 20)]
    assert intensities == sorted(intensities) and intensities[-1] == pytest.approx(limit, rel=1e-3)
    assert linear(64, 256, 1024, bytes_per_element=2).intensity == pytest.approx(
        2 * linear(64, 256, 1024).intensity)                   # bf16: half the bytes


def test_linear_limits_weights_dominate_few_tokens_activations_cap_many():
    lim = linear_limits(256, 1024)
    assert lim["crossover"] == pytest.approx(256 * 1024 / 1280)          # 204.8 tokens
    assert lim["cap"] == pytest.approx(102.4) and lim["small_t_slope"] == 0.5
    for t in (1, 2, 4):                      # weights' bytes dominate: I ≈ 2t/e, within 2 %
        kern = linear(t, 256, 1024, bias=False)
        assert 4 * 256 * 1024 / kern.bytes > 0.97
        assert kern.intensity == pytest.approx(lim["small_t_slope"] * t, rel=0.02)
    for t in (1 << 16, 1 << 20):             # activations' bytes dominate: I → the cap
        kern = linear(t, 256, 1024, bias=False)
        assert 4 * t * (256 + 1024) / kern.bytes > 0.99
        assert kern.intensity == pytest.approx(lim["cap"], rel=0.01)
    # Without bias I(t) = cap · t / (t + t×): half the cap at the crossover, 90 % at 9 t×.
    square = linear_limits(256, 256)                 # k = m = 256: t× = 128 tokens
    assert square["crossover"] == 128
    assert linear(128, 256, 256, bias=False).intensity == pytest.approx(square["cap"] / 2)
    assert linear(9 * 128, 256, 256, bias=False).intensity == pytest.approx(0.9 * square["cap"])


def test_attention_and_layernorm_do_not_move_with_the_micro_batch():
    unfused = [attention(b, 128, 256, 4).intensity for b in (1, 8, 64)]
    assert unfused[0] == unfused[1] == unfused[2]
    s, h, a = 128, 256, 4
    assert unfused[0] == pytest.approx(4 * s * h / (4 * (4 * h + 8 * a * s)))
    assert attention(3, s, h, a, fused=True).intensity == pytest.approx(s / 4)   # I = s / e
    ln = [layernorm(t, 256).intensity for t in (16, 1024, 1 << 16)]
    assert ln[-1] == pytest.approx(1.0, rel=1e-3) and max(ln) - min(ln) < 0.1


def test_flops_equal_what_the_models_modules_run():
    torch.manual_seed(0)
    model = TinyGPT(CFG)
    block = model.blocks[0]
    b, s, h, nh = 3, CFG.seq_len, CFG.d_model, CFG.n_head
    x = torch.randn(b, s, h)
    q, k, v = (torch.randn(b, nh, s, h // nh) for _ in range(3))
    assert count_flops(lambda: block.mlp.up_proj(x)) == linear(b * s, h, CFG.ff_dim).flops
    assert count_flops(lambda: block.attn.attend(q, k, v)) == attention(b, s, h, nh).flops
    # A whole block: every matmul the kernels list (layernorms do none).
    kernels = gpt_block_kernels(CFG, b)
    assert [kk.name for kk in kernels] == ["ln_1", "q_proj", "k_proj", "v_proj", "attention",
                                           "out_proj", "ln_2", "up_proj", "down_proj"]
    assert count_flops(lambda: block(x)) == sum(kk.flops for kk in kernels
                                                if not kk.name.startswith("ln"))


def test_tokens_to_ridge_is_the_first_compute_bound_token_count():
    t = tokens_to_ridge(256, 1024, A100_SXM, bytes_per_element=2)
    assert linear(t, 256, 1024, bytes_per_element=2).intensity >= A100_SXM.ridge
    assert linear(t - 1, 256, 1024, bytes_per_element=2).intensity < A100_SXM.ridge
    # 2·256·1024·t ≥ I*·2·(1280·t + 256·1024 + 1024)  ⇔  t ≥ 607.5 (I* = 312 / 2.039 = 153.02)
    assert t == 608                                 # 38 sequences of 16 tokens
    # fp32: the activation traffic caps I at 102.4 FLOP/B < 153: never compute-bound there.
    assert tokens_to_ridge(256, 1024, A100_SXM, bytes_per_element=4) is None
    # A CPU-like ridge of 4.5 FLOP/B: t·(524288 − 4.5·4·1280) ≥ 4.5·4·263168 ⇔ t ≥ 9.45.
    assert tokens_to_ridge(256, 1024, HERE) == 10
    for k, m in ((32, 128), (512, 512), (4096, 16384)):
        tt = tokens_to_ridge(k, m, H100_SXM, bytes_per_element=2)
        if tt is not None:
            assert linear(tt, k, m, bytes_per_element=2).intensity >= H100_SXM.ridge
            assert tt == 1 or linear(tt - 1, k, m, bytes_per_element=2).intensity < H100_SXM.ridge


def test_roofline_time_and_mfu_bound():
    roof = Roof("r", peak_flops=10.0, bandwidth=1.0)
    fast, slow = Kernel("fast", 100.0, 1.0), Kernel("slow", 10.0, 10.0)
    assert roofline_time([fast], roof) == 10.0 and mfu_bound([fast], roof) == 1.0
    assert roofline_time([slow], roof) == 10.0 and mfu_bound([slow], roof) == pytest.approx(0.1)
    assert mfu_bound([fast, slow], roof) == pytest.approx(11.0 / 20.0)
    small = mfu_bound(gpt_block_kernels(CFG, 1), A100_SXM)
    large = mfu_bound(gpt_block_kernels(CFG, 64), A100_SXM)
    assert 0 < small < large < 1


@pytest.mark.parametrize("call, message", [
    (lambda: linear(0, 4, 4), "tokens"),
    (lambda: attention(1, 8, 30, 4, bytes_per_element=0), "bytes_per_element"),
    (lambda: Roof("x", 0.0, 1.0), "peak_flops"),
    (lambda: attainable(-1.0, peak_flops=1.0, bandwidth=1.0), "intensity"),
    (lambda: mfu_bound([], HERE), "empty"),
    (lambda: layer_kernel("softmax", CFG, 1), "layer must be one of"),
])
def test_bad_arguments_are_named(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_roofline_figure_draws_each_roof_to_its_ridge_and_the_points():
    fig = roofline_figure([HERE, A100_SXM], [{"label": "b=1", "intensity": 2.0, "flops": 3e10,
                                              "lo": 2e10, "hi": 4e10, "group": "up_proj"}])
    here = next(t for t in fig.data if t.name == "here")
    assert max(here.y) == HERE.peak_flops and HERE.ridge in here.x
    assert here.y[list(here.x).index(HERE.ridge)] == pytest.approx(HERE.peak_flops)
    point = next(t for t in fig.data if t.name == "up_proj")
    assert list(point.x) == [2.0] and list(point.error_y.array) == [1e10]
    assert fig.layout.xaxis.type == "log" == fig.layout.yaxis.type
    json.dumps(fig.to_plotly_json(), default=str)


def test_roofline_view_says_where_each_machine_stands():
    fig, text = roofline_view(layer="up_proj", micro_batch=64, seq_len=16, bytes_per_element=2,
                              cfg=dataclasses.replace(CFG, d_model=256, n_head=4), here=HERE)
    assert "<b>A100 SXM bf16</b> (ridge 153 FLOP/B): compute-bound" in text
    assert "compute-bound from micro-batch 38" in text
    assert "<b>H100 SXM bf16</b> (ridge 295 FLOP/B): memory-bound" in text
    assert "never compute-bound" in text
    k = layer_kernel("up_proj", dataclasses.replace(CFG, d_model=256), 64, bytes_per_element=2)
    marks = [t for t in fig.data if t.name == "up_proj"]
    assert list(marks[0].x) == [k.intensity] * 3
    assert list(marks[0].y) == [r.attainable(k.intensity) for r in (HERE, A100_SXM, H100_SXM)]
    for layer in LAYERS:
        roofline_view(layer=layer, micro_batch=1, seq_len=64, bytes_per_element=4, cfg=CFG,
                      here=HERE)


def test_mfu_bound_figure_has_a_line_per_roof_and_the_measured_points():
    fig = mfu_bound_figure(CFG, [1, 4, 16], [HERE, A100_SXM], measured={"here": {1: 0.2, 4: 0.5}},
                           bytes_per_element={"A100 SXM bf16": 2})
    lines = [t for t in fig.data if t.name.startswith("bound: ")]
    assert [t.name for t in lines] == ["bound: here (32-bit)", "bound: A100 SXM bf16 (16-bit)"]
    assert list(lines[0].y) == [mfu_bound(gpt_block_kernels(CFG, b), HERE) for b in (1, 4, 16)]
    assert list(lines[1].y) == [mfu_bound(gpt_block_kernels(CFG, b, bytes_per_element=2),
                                          A100_SXM) for b in (1, 4, 16)]
    assert list(fig.data[-1].y) == [0.2, 0.5]


def test_roofline_explorer_redraws_when_a_control_moves():
    cfg = dataclasses.replace(CFG, d_model=256)
    ex = roofline_explorer(cfg, here=HERE)
    assert "micro-batch 1," in ex.figure.layout.title.text
    ex.micro_batch.value = 64
    assert "micro-batch 64," in ex.figure.layout.title.text
    before = ex.verdict.value
    ex.bytes_per_element.value = 2
    assert ex.verdict.value != before and "compute-bound from micro-batch 38" in ex.verdict.value
    ex.layer.value = "ln_1"
    assert ex.figure.layout.title.text.startswith("ln_1")
    with pytest.raises(ValueError, match="micro_batch must be one of"):
        roofline_explorer(cfg, here=HERE, micro_batch=3)
