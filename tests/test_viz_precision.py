"""toolkit.viz.precision and the loss-scale explorer's view: the figures carry the formats'
limits from toolkit.formats, counts of the values drawn, the fractions of toolkit.formats
.survival (zeros included), and the scales and skipped steps they are given."""

from __future__ import annotations

import math

import pytest
import torch

from toolkit import formats as FMT
from toolkit.viz.precision import amax_history, format_ranges, scale_history, survival_histogram
from toolkit.widgets.precision import (amax_history_explorer, amax_history_view,
                                       loss_scale_explorer, loss_scale_view)


def test_format_ranges_draws_subnormal_and_normal_parts_from_the_limits():
    fmts = [FMT.format_info(n) for n in ("fp32", "fp16", "bf16")]
    fig = format_ranges(fmts, marks={"1e-8": 1e-8})
    assert len(fig.data) == 2 * len(fmts)
    fp16 = [t for t in fig.data if t.y == ("fp16",)]
    sub, normal = sorted(fp16, key=lambda t: t.base[0])
    assert sub.base[0] == -24 and sub.x[0] == pytest.approx(-14 - -24)   # 2^-24 .. 2^-14
    assert normal.base[0] == -14 and normal.base[0] + normal.x[0] == pytest.approx(
        math.log2(65504))
    assert fig.layout.shapes[0].x0 == pytest.approx(math.log2(1e-8))
    with pytest.raises(ValueError, match="no formats"):
        format_ranges([])


def test_survival_histogram_counts_every_nonzero_value_and_legends_all_values():
    values = torch.tensor([0.0, 0.0, 1e-9, 1e-6, 1.0, 1e6])
    fig = survival_histogram(values, FMT.format_info("fp16"))
    bars = [t for t in fig.data if t.type == "bar"]
    assert len(bars) == 1 and sum(bars[0].y) == 4                     # the zeros are not drawn
    legend = {t.name.split(":")[0]: t.name for t in fig.data if t.type == "scatter"}
    # Of all 6 values: 1e-9 flushed, 1e-6 subnormal, 1e6 overflows, 0, 0 and 1 kept whole.
    assert legend["zero"].endswith("16.67%") and legend["subnormal"].endswith("16.67%")
    assert legend["overflow"].endswith("16.67%") and legend["normal"].endswith("50.00%")
    lifted = survival_histogram(values, FMT.format_info("fp16"), scale=2.0 ** 10)
    assert "2^10" in lifted.layout.title.text
    assert min(lifted.data[-1].x) - min(bars[0].x) == pytest.approx(10, abs=0.25)
    with pytest.raises(ValueError, match="no nonzero"):
        survival_histogram(torch.zeros(3), FMT.format_info("bf16"))


def test_scale_history_plots_log2_and_marks_skipped_steps():
    fig = scale_history({"a": [2.0 ** 4, 2.0 ** 5, 2.0 ** 4]}, skipped={"a": [1]})
    assert list(fig.data[0].y) == [4, 5, 4]
    assert list(fig.data[1].x) == [1] and list(fig.data[1].y) == [5]
    assert fig.data[1].name == "a: skipped (1)"
    with pytest.raises(ValueError, match="no runs"):
        scale_history({})


def test_loss_scale_view_verdicts_follow_the_fractions():
    g = torch.tensor([1e-9, 1e-3, 1.0])
    _, lost = loss_scale_view(magnitudes=g, fmt="fp16", log2_scale=0)
    assert "33.33%</b> flushed" in lost and "a larger scale would keep them" in lost
    _, kept = loss_scale_view(magnitudes=g, fmt="fp16", log2_scale=12)
    assert "0.00%</b> flushed" in kept and "0.00%</b> overflow" in kept
    _, over = loss_scale_view(magnitudes=g, fmt="fp16", log2_scale=20)
    assert "skips this step and halves" in over
    _, bf16 = loss_scale_view(magnitudes=g, fmt="bf16", log2_scale=0)
    assert "every value kept with full precision" in bf16
    _, shifted = loss_scale_view(magnitudes=g, fmt="fp16", log2_scale=12, shift=-4)
    assert "33.33%</b> flushed" in shifted                            # 1e-13 · 2^12 < 2^-25
    with pytest.raises(ValueError, match="fmt must be one of"):
        loss_scale_view(magnitudes=g, fmt="fp12")
    with pytest.raises(ValueError, match="magnitudes is empty"):
        loss_scale_explorer(torch.zeros(0))


def test_amax_history_draws_the_delayed_range_and_marks_overflows():
    e4m3 = FMT.format_info("fp8 e4m3")
    fig = amax_history([1.0, 2.0, 1.0], [448.0, 448.0, 224.0], e4m3)
    top, floor, amax, over = fig.data
    assert list(top.y) == pytest.approx([0, 0, 1])                 # log2(448 / s)
    assert floor.y[0] == pytest.approx(math.log2(2.0 ** -10 / 448))
    assert list(amax.y) == [0, 1, 0]
    assert list(over.x) == [1] and over.name.endswith("(1)")       # 2 · 448 > 448
    with pytest.raises(ValueError, match="one scale per amax"):
        amax_history([1.0], [], e4m3)


def test_amax_history_view_counts_overflows_per_history_length():
    rising = [1.0, 2.0, 4.0, 8.0, 4.0, 2.0, 1.0]
    _, short = amax_history_view(amaxes=rising, fmt="fp8 e4m3", history_len=1)
    assert "<b style='color:#9467bd'>3</b> of 6 steps overflow" in short   # steps 1, 2, 3
    _, margin = amax_history_view(amaxes=rising, fmt="fp8 e4m3", history_len=1, margin=1)
    assert "<b style='color:#9467bd'>0</b> of 6" in margin                # doubling fits
    # A long history keeps the scale of the peak: no overflow, but the range sits unused:
    # log2(2 · 8 / a) = 2, 3, 4 binades on the way down after 0, 0, 0 on the way up.
    _, long = amax_history_view(amaxes=rising, fmt="fp8 e4m3", history_len=7, margin=1)
    assert "<b>1.5</b> powers of two" in long
    explorer = amax_history_explorer(rising, fmt="fp8 e4m3", history_len=1)
    explorer.margin.value = 1
    assert "<b style='color:#9467bd'>0</b>" in explorer.verdict.value
    with pytest.raises(ValueError, match="fmt must be one of"):
        amax_history_explorer(rising, fmt="bf16")
    with pytest.raises(ValueError, match="at least 2 steps"):
        amax_history_explorer([1.0])
