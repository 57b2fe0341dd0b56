"""toolkit.memory: ZeRO's published numbers, Korthikanti's activation formulas, parameter counts
of published shapes, the budget, and the byte counter that measures live tensors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from toolkit import memory as M
from toolkit.models import TinyMLP, count_parameters


def test_zero_paper_figure_1():
    # ZeRO (SC 2020), Figure 1: Ψ = 7.5B, N_d = 64, mixed-precision Adam (K = 12).
    gb = [M.model_state_bytes(7.5e9, 64, stage).total / M.GB for stage in M.STAGES]
    assert [round(x, 2) for x in gb] == [120.0, 31.41, 16.64, 1.88]
    assert f"{gb[1]:.1f} {gb[2]:.1f} {gb[3]:.2f}" == "31.4 16.6 1.88"


@pytest.mark.parametrize("n_d", [1, 2, 8, 64])
def test_stage_formulas_mixed_adam(n_d):
    P = 1e9
    s = [M.model_state_bytes(P, n_d, stage) for stage in M.STAGES]
    assert s[0].total == 16 * P
    assert s[1].total == pytest.approx(4 * P + 12 * P / n_d)
    assert s[2].total == pytest.approx(2 * P + 14 * P / n_d)
    assert s[3].total == pytest.approx(16 * P / n_d)
    assert (s[1].params, s[1].grads, s[1].optimizer) == (2 * P, 2 * P, 12 * P / n_d)
    assert [x.total for x in s] == sorted((x.total for x in s), reverse=True)


def test_other_recipes():
    P, n = 1000, 4
    assert M.model_state_bytes(P, recipe=M.FP32_ADAM).total == 16 * P
    assert M.model_state_bytes(P, n, 1, M.FP32_ADAM).total == 8 * P + 8 * P / n
    assert M.model_state_bytes(P, n, 2, M.SGD_MOMENTUM).total == 4 * P + 8 * P / n
    assert M.model_state_bytes(P, n, 1, M.SGD).total == 8 * P  # nothing to shard in stage 1
    assert M.RECIPES["mixed-precision Adam"].total_bytes == 16
    custom = M.Recipe("bf16 SGD", 2, 2, 4)
    assert M.model_state_bytes(P, n, 3, custom).total == 8 * P / n
    with pytest.raises(ValueError, match="optimizer_bytes"):
        M.Recipe("bad", 2, 2, -1)


def test_frozen_parameters_take_no_grads_or_state():
    s = M.model_state_bytes(1000, 2, 0, M.FP32_ADAM, frozen=400)
    assert (s.params, s.grads, s.optimizer) == (4000, 2400, 4800)


def test_padding_is_what_a_flat_shard_stores():
    assert M.shard_numel(10, 4) == 3 and M.shard_numel(12, 4) == 3 and M.shard_numel(0, 3) == 0
    s1 = M.model_state_bytes(10, 4, 1, M.FP32_ADAM, padded=True)
    assert (s1.params, s1.grads, s1.optimizer) == (4 * 12, 4 * 12, 8 * 3)
    s3 = M.model_state_bytes(10, 4, 3, M.FP32_ADAM, padded=True)
    assert s3.total == 16 * 3
    s0 = M.model_state_bytes(10, 4, 0, M.FP32_ADAM, padded=True)
    assert s0.total == 16 * 10  # plain data parallel has no flat buffer to pad


def test_state_errors_name_the_argument():
    with pytest.raises(ValueError, match="stage must be one of"):
        M.model_state_bytes(10, 2, 4)
    with pytest.raises(ValueError, match="n_d must be an int >= 1"):
        M.model_state_bytes(10, 0, 1)
    with pytest.raises(ValueError, match="frozen"):
        M.model_state_bytes(10, 2, 1, frozen=11)
    with pytest.raises(TypeError, match="Recipe"):
        M.model_state_bytes(10, 2, 1, "adam")


def test_activations_korthikanti():
    s, b, h, a = 2048, 1, 12288, 96  # GPT-3 175B
    sbh = s * b * h
    none = M.activation_bytes_per_layer(seq_len=s, batch=b, hidden=h, heads=a)
    assert none == sbh * (34 + 5 * a * s / h) == sbh * 114  # 5·a·s/h = 80 for GPT-3
    tp = M.activation_bytes_per_layer(seq_len=s, batch=b, hidden=h, heads=a, tensor_parallel=8)
    assert tp == pytest.approx(sbh * (10 + 24 / 8 + 5 * a * s / (h * 8)))
    sp = M.activation_bytes_per_layer(seq_len=s, batch=b, hidden=h, heads=a, tensor_parallel=8,
                                      sequence_parallel=True)
    assert sp == pytest.approx(none / 8) and sp < tp < none
    full = M.activation_bytes_per_layer(seq_len=s, batch=b, hidden=h, heads=a, recompute="full")
    assert full == 2 * sbh
    # t = 1: tensor parallel reduces to the plain formula (10 + 24 = 34).
    assert M.activation_bytes_per_layer(seq_len=s, batch=b, hidden=h, heads=a,
                                        tensor_parallel=1) == none
    assert M.activation_bytes(layers=96, seq_len=s, batch=b, hidden=h, heads=a) == 96 * none
    with pytest.raises(ValueError, match="recompute"):
        M.activation_bytes_per_layer(seq_len=s, batch=b, hidden=h, heads=a, recompute="some")
    with pytest.raises(ValueError, match="batch must be an int >= 1"):
        M.activation_bytes_per_layer(seq_len=s, batch=0, hidden=h, heads=a)


# (s, b, h, a, t): GPT-3 175B, Korthikanti's 22B and 530B, GPT-2 XL, and odd small sizes.
SHAPES = [(2048, 1, 12288, 96, 8), (2048, 4, 6144, 64, 8), (2048, 1, 20480, 128, 8),
          (1024, 8, 1600, 25, 1), (96, 3, 40, 5, 5), (4096, 2, 4096, 32, 4)]


@pytest.mark.parametrize("s, b, h, a, t", SHAPES)
def test_selective_and_flash_cases_against_table_2(s, b, h, a, t):
    def act(**kw):
        return M.activation_bytes_per_layer(seq_len=s, batch=b, hidden=h, heads=a,
                                            tensor_parallel=t, **kw)

    sbh = s * b * h
    # Korthikanti et al. 2022, Table 2: the paper's four rows, then its two selective rows.
    assert act() == pytest.approx(sbh * (10 + 24 / t + 5 * a * s / (h * t)), rel=1e-12)
    assert act(sequence_parallel=True) == pytest.approx(sbh * (34 / t + 5 * a * s / (h * t)),
                                                        rel=1e-12)
    assert act(recompute="full") == 2 * sbh
    assert act(recompute="full", sequence_parallel=True) == pytest.approx(2 * sbh / t)
    assert act(recompute="selective") == pytest.approx(sbh * (10 + 24 / t), rel=1e-12)
    assert act(recompute="selective", sequence_parallel=True) == pytest.approx(sbh * 34 / t,
                                                                               rel=1e-12)
    # Flash-style attention stores no s×s scores: the 5·a·s/h term drops, the rest stays.
    for sp in (False, True):
        assert act(attention="flash", sequence_parallel=sp) == act(recompute="selective",
                                                                   sequence_parallel=sp)
        assert act(sequence_parallel=sp) - act(attention="flash", sequence_parallel=sp) == (
            pytest.approx(5 * a * s * s * b / t, rel=1e-12))
    assert act(attention="flash", recompute="full") == act(recompute="full")


@pytest.mark.parametrize("s, b, h, a, t", SHAPES)
def test_context_parallel_scores_are_linear_in_cp(s, b, h, a, t):
    for cp in (c for c in (2, 3, 4, 8) if s % c == 0):
        def act(**kw):
            return M.activation_bytes_per_layer(seq_len=s, batch=b, hidden=h, heads=a,
                                                tensor_parallel=t, sequence_parallel=True, **kw)

        linear = act(context_parallel=cp)
        # s/cp queries per rank, each against all s keys: 5·a·(s/cp)·s·b/t of scores.
        assert linear == pytest.approx((s // cp) * b * h * 34 / t + 5 * a * (s // cp) * s * b / t,
                                       rel=1e-12)
        assert linear == pytest.approx(act() / cp, rel=1e-12)  # everything divides by cp
        # The old mistake: a rank's shard treated as a short sequence (scores quadratic in cp).
        quadratic = M.activation_bytes_per_layer(seq_len=s // cp, batch=b, hidden=h, heads=a,
                                                 tensor_parallel=t, sequence_parallel=True)
        assert quadratic < linear
        assert linear - quadratic == pytest.approx(5 * a * (s // cp) * (s - s // cp) * b / t,
                                                   rel=1e-9)
        assert act(context_parallel=cp, attention="flash") == pytest.approx(
            (s // cp) * b * h * 34 / t, rel=1e-12)


def test_activation_case_errors_name_the_argument():
    kw = dict(seq_len=10, batch=1, hidden=8, heads=2)
    with pytest.raises(ValueError, match="attention must be one of"):
        M.activation_bytes_per_layer(**kw, attention="fused")
    with pytest.raises(ValueError, match="context_parallel=3 must divide seq_len=10"):
        M.activation_bytes_per_layer(**kw, context_parallel=3)
    with pytest.raises(ValueError, match="context_parallel must be an int >= 1"):
        M.activation_bytes_per_layer(**kw, context_parallel=0)
    assert set(M.RECOMPUTE) == {"none", "selective", "full"}
    assert M.ATTENTION == ("materialised", "flash")


def test_published_parameter_counts():
    assert M.MODELS["gpt2-small"].num_params == 124_439_808  # the released checkpoint's count
    assert M.MODELS["bert-large"].num_params == 335_141_888  # bert-large-uncased's count
    for shape in M.MODELS.values():
        assert abs(shape.relative_error) < 0.05, shape.name
    assert abs(M.MODELS["gpt3-175b"].relative_error) < 0.01
    assert abs(M.MODELS["zero-7.5b"].relative_error) < 0.01
    with pytest.raises(ValueError, match="unknown model 'gpt5'"):
        M.model_shape("gpt5")


def test_budget_gpt2_xl_and_7_5b():
    xl = M.model_shape("gpt2-xl")
    b = M.budget("gpt2-xl", batch=1)
    assert b.model_states == 16 * xl.num_params
    assert b.activations == xl.layers * xl.seq_len * xl.hidden * (34 + 5 * 25 * 1024 / 1600)
    assert b.total == b.model_states + b.activations and b.fits == (b.total <= 80 * M.GiB)
    big = M.budget("zero-7.5b", n_d=64, stage=0, batch=1, gpu_bytes=32 * M.GiB)
    assert not big.fits and big.headroom < 0  # 16Ψ ≈ 119 GB on one 32 GB V100
    small = M.budget("zero-7.5b", n_d=64, stage=3, batch=1, gpu_bytes=32 * M.GiB)
    assert small.fits and small.model_states == pytest.approx(8 * small.params)  # 16Ψ/N vs 2Ψ/N
    assert list(small.as_dict()) == ["params", "grads", "optimizer", "activations"]
    recomputed = M.budget("gpt2-xl", batch=8, recompute="full")
    assert recomputed.activations == 48 * 2 * 1024 * 8 * 1600


def test_storage_bytes_counts_views_once():
    buf = torch.zeros(100)
    assert M.storage_bytes([buf[:10], buf[50:], None]) == 400
    freed = torch.zeros(10)
    freed.untyped_storage().resize_(0)
    assert M.storage_bytes([freed]) == 0


def test_held_model_states_match_fp32_adam_on_one_process():
    model = TinyMLP(d_in=5, d_hidden=7, d_out=3)
    opt = torch.optim.Adam(model.parameters())
    F.mse_loss(model(torch.randn(4, 5)), torch.zeros(4, 3)).backward()
    opt.step()
    P = count_parameters(model)
    held = M.held_model_states(model, opt)
    predicted = M.model_state_bytes(P, 1, 0, M.FP32_ADAM)
    assert (held.params, held.grads, held.optimizer) == (predicted.params, predicted.grads,
                                                         predicted.optimizer)
    n_tensors = len(list(model.parameters()))
    assert held.step_bytes == 4 * n_tensors  # Adam's 0-dim float32 `step` per parameter tensor


def test_viz_memory_bars_stack_the_parts():
    from toolkit.viz.memory import memory_bars, stage_bars

    fig = stage_bars(7.5e9, 64, gpu_bytes=32 * M.GiB, highlight=3)
    bars = [t for t in fig.data if t.type == "bar"]
    assert [t.name for t in bars] == ["params", "grads", "optimizer"]  # no activations given
    totals = [sum(t.y[i] for t in bars) for i in range(4)]
    # Drawn in GiB (the course's IEC convention); in the paper's decimal GB, its Figure 1.
    assert fig.layout.yaxis.title.text == "GiB per device"
    assert [round(x * M.GiB / M.GB, 2) for x in totals] == [120.0, 31.41, 16.64, 1.88]
    assert any("device memory 32 GiB" in a.text for a in fig.layout.annotations)
    assert list(bars[0].marker.line.width) == [0, 0, 0, 3]
    small = memory_bars({"a": {"params": 3 * 2**20}})  # the unit follows the largest bar
    assert small.layout.yaxis.title.text == "MiB per device" and small.data[0].y[0] == 3
    with pytest.raises(ValueError, match="unknown parts"):
        memory_bars({"a": {"weights": 1.0}})
    with pytest.raises(ValueError, match="IEC"):
        memory_bars({"a": {"params": 1.0}}, unit="GB")  # decimal: not the course's unit


def test_memory_calculator_view_and_explorer():
    from toolkit.widgets.memory import CUSTOM, memory_explorer, memory_view

    _, verdict = memory_view(model="zero-7.5b", n_d=64, stage=1, gpu_gib=32)
    assert "does not fit" in verdict and "Lowest stage that fits: 2" in verdict
    fig, verdict = memory_view(model=CUSTOM, num_params=7.5e9, n_d=64, stage=3, gpu_gib=32)
    # 16 · 7.5e9 / 64 bytes: the paper's 1.88 GB (10⁹ bytes) is 1.75 GiB.
    assert "1.75 GiB per device" in verdict and "on 32 GiB" in verdict
    assert "fits" in verdict and "not counted" in verdict
    explorer = memory_explorer("gpt2-xl", n_d=6, gpu_gib=79)
    assert explorer.n_d.value == 8 and explorer.gpu_gib.value == 80
    before = explorer.figure
    explorer.stage.value = 3  # a control change redraws
    assert explorer.figure is not before and "Stage 3" in explorer.verdict.value
    assert len(explorer.output.outputs) == 1
    with pytest.raises(ValueError, match="unknown model"):
        memory_explorer("gpt5")


def test_dim0_shards_as_torch_chunk():
    from toolkit.experiments.memory import dim0_shard_numel

    shapes = [(5, 3), (2,), (4, 2, 2)]
    # torch.chunk along dim 0 on 4 ranks: rows 2,2,1,0 / 1,1,0,0 / 1,1,1,1
    assert [dim0_shard_numel(shapes, 4, r, padded=False) for r in range(4)] == [
        2 * 3 + 1 + 4, 2 * 3 + 1 + 4, 1 * 3 + 0 + 4, 0 + 0 + 4]
    assert dim0_shard_numel(shapes, 4, 3, padded=True) == 2 * 3 + 1 + 4
