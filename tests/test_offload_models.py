"""The offload models: bytes per tier (toolkit.memory.offload) against ZeRO-Offload's and
ZeRO-Infinity's published numbers, and the step-time and efficiency models
(toolkit.cost.offload) against their closed forms and the papers' bandwidth claims."""

from __future__ import annotations

import math

import pytest

from toolkit import memory as M
from toolkit.cost import AlphaBeta
from toolkit.cost.offload import (
    PUBLISHED, TierLink, arithmetic_intensity, bandwidth_needed, efficiency, iteration_flops,
    step_bytes, step_time,
)
from toolkit.memory.offload import (
    DGX2, INFINITY_ADAM, INFINITY_CPU, INFINITY_NVME, NO_OFFLOAD, PLACEMENTS, TB, ZERO_OFFLOAD,
    Placement, TiB, largest_model, offload_budget, offload_bytes, working_bytes,
)

V100 = 32 * M.GiB

# ZeRO-Infinity (SC 2021), §3's memory table: layers, hidden size; parameters (trillions), model
# states (TB, binary, at 20 bytes per parameter), model-state working memory per GPU (GB, binary).
TABLE1 = [(80, 10 * 1024, 0.10, 1.83, None), (100, 20 * 1024, 0.50, 9.16, 6.25),
          (128, 25 * 1024, 1.01, 18.31, 9.77), (195, 64 * 1024, 10.05, 182.81, 64.00),
          (315, 160 * 1024, 101.47, 1845.70, 400.00)]


@pytest.mark.parametrize("layers, hidden, params_t, states_tb, working_gb", TABLE1)
def test_zero_infinity_table_1(layers, hidden, params_t, states_tb, working_gb):
    psi = 12 * layers * hidden ** 2  # the paper's count: four linear layers per block
    assert round(psi / 1e12, 2) == params_t
    assert INFINITY_ADAM.total_bytes == 20
    assert round(M.model_state_bytes(psi, recipe=INFINITY_ADAM).total / TiB, 2) == states_tb
    if working_gb is not None:
        assert round(working_bytes(hidden) / M.GiB, 2) == working_gb


def test_zero_offload_puts_2_bytes_on_the_gpu_and_14_on_the_cpu():
    psi = 1e9
    tiers = offload_bytes(psi, ZERO_OFFLOAD)
    assert (tiers.gpu, tiers.cpu, tiers.nvme) == (2 * psi, 14 * psi, 0)
    shared = offload_bytes(psi, ZERO_OFFLOAD, n_d=4)  # ZeRO-2 partitions: CPU share 14Ψ/4
    assert (shared.gpu, shared.cpu) == (2 * psi, 14 * psi / 4)
    assert offload_bytes(psi, NO_OFFLOAD).gpu == 16 * psi


def test_zero_offload_13b_on_one_v100():
    """Ren et al., abstract: over 13 billion parameters on one V100 (32 GB, in a DGX-2)."""
    one_gpu = {"gpu": V100, "cpu": DGX2.cpu_bytes}
    assert offload_bytes(13e9, ZERO_OFFLOAD).fits(one_gpu)
    assert not offload_bytes(13e9, Placement("plain data parallel", 0)).fits(one_gpu)
    biggest = largest_model(ZERO_OFFLOAD, one_gpu)
    plain = largest_model(Placement("plain data parallel", 0), one_gpu)
    assert biggest == V100 / 2 > 13e9 and plain == V100 / 16 < 2.2e9
    assert biggest / plain == 8  # GPU bytes per parameter 16 → 2 (the paper's ~10x adds
    # what activations and buffers take from the smaller model's 32 GB)


def test_zero_infinity_trillion_on_one_dgx2_and_32_trillion_on_32():
    """Rajbhandari et al., abstract and §8: fine-tune a trillion parameters on one DGX-2
    node; 32 trillion on 512 V100s (32 nodes). Model states only, NVMe against CPU."""
    per_rank = DGX2.per_rank()
    trillion = 12 * 128 * (25 * 1024) ** 2  # the §3 table's 1.01T model
    on_nvme = offload_bytes(trillion, INFINITY_NVME, n_d=16, recipe=INFINITY_ADAM,
                            working=working_bytes(25 * 1024))
    assert on_nvme.fits(per_rank)
    assert not offload_bytes(trillion, INFINITY_CPU, n_d=16, recipe=INFINITY_ADAM).fits(per_rank)
    assert largest_model(INFINITY_NVME, per_rank, n_d=16, recipe=INFINITY_ADAM) == 30 * TB / 20
    ranks = 512
    assert 20 * 32e12 <= 32 * DGX2.nvme_bytes and 20 * 32e12 > 32 * DGX2.cpu_bytes
    assert largest_model(INFINITY_NVME, per_rank, n_d=ranks, recipe=INFINITY_ADAM) >= 32e12
    assert largest_model(INFINITY_CPU, per_rank, n_d=ranks, recipe=INFINITY_ADAM) < 32e12


@pytest.mark.parametrize("name", list(PLACEMENTS))
@pytest.mark.parametrize("n_d", [1, 3, 64])
def test_placing_moves_bytes_between_tiers_without_changing_them(name, n_d):
    placement = PLACEMENTS[name]
    tiers = offload_bytes(7.5e9 + 1, placement, n_d=n_d, padded=True)
    states = M.model_state_bytes(7.5e9 + 1, n_d, placement.stage, padded=True)
    assert tiers.gpu + tiers.cpu + tiers.nvme == states.total
    for part in ("params", "grads", "optimizer"):
        where = getattr(placement, part)
        assert tiers.parts[where][part] == getattr(states, part)


def test_budget_per_tier_extends_lesson_07s():
    one = M.budget("gpt2-xl", stage=2, recompute="full")
    tiers = offload_budget("gpt2-xl", ZERO_OFFLOAD)
    assert tiers.gpu == one.params + one.activations  # the rest went to the CPU
    assert tiers.cpu == one.grads + one.optimizer
    infinity = offload_budget("gpt2-xl", INFINITY_NVME, n_d=8)
    shape = M.model_shape("gpt2-xl")
    # Off the GPU: everything but the largest operator's working set (here the embedding).
    assert infinity.parts["gpu"] == {"working": 4 * shape.vocab * shape.hidden}
    assert infinity.cpu == one.activations


def test_largest_model_respects_reserved_bytes_and_empty_tiers():
    cap = {"gpu": 80 * M.GiB, "cpu": 1 * TiB}
    assert largest_model(ZERO_OFFLOAD, cap, reserved={"gpu": 80 * M.GiB}) == 0
    assert largest_model(INFINITY_NVME, cap) == 0  # no NVMe at all
    assert largest_model(ZERO_OFFLOAD, cap) == min(80 * M.GiB / 2, TiB / 14)


def test_placement_and_tier_names_are_checked():
    with pytest.raises(ValueError, match="optimizer must be one of"):
        Placement("x", 2, optimizer="disk")
    with pytest.raises(ValueError, match="stage must be one of"):
        Placement("x", 4)
    with pytest.raises(ValueError, match="name must be one of"):
        offload_bytes(1e9, ZERO_OFFLOAD).tier("hbm")


def test_step_bytes():
    assert step_bytes(1000, state_bytes=8) == (8000, 8000)
    assert step_bytes(1000, state_bytes=8, first=True) == (0, 8000)
    assert step_bytes(1000, state_bytes=8, master_bytes=4, first=True) == (4000, 12000)


LINK = TierLink("x", AlphaBeta(1e-4, 1e-9), AlphaBeta(2e-4, 2e-9))


def test_step_time_serial_is_the_sum():
    chunks = [1000, 1000, 500]
    t = step_time(chunks, tier=LINK, update=AlphaBeta(1e-4, 1e-8), read_bytes=8,
                  write_bytes=8, prefetch=False)
    r = sum(1e-4 + 8 * n * 1e-9 for n in chunks)
    u = sum(1e-4 + n * 1e-8 for n in chunks)
    w = sum(2e-4 + 8 * n * 2e-9 for n in chunks)
    assert math.isclose(t.seconds, r + u + w) and math.isclose(t.read, r)
    assert [s.kind for s in t.spans] == ["read", "update", "write"] * 3
    two = step_time(chunks, tier=LINK, update=AlphaBeta(1e-4, 1e-8), read_bytes=8,
                    write_bytes=8, tensors=2, prefetch=False)  # Adam: two states, two copies
    assert math.isclose(two.read, r + 3 * 1e-4) and math.isclose(two.write, w + 3 * 2e-4)
    with pytest.raises(ValueError, match="tensors"):
        step_time(chunks, tier=LINK, update=AlphaBeta(1e-4, 1e-8), read_bytes=8,
                  write_bytes=8, tensors=0)


def test_step_time_prefetch_bounds_and_compute_bound_closed_form():
    m, n = 8, 1 << 16
    slow = AlphaBeta(0, 1e-6)  # the update is far slower than the transfers
    t = step_time([n] * m, tier=LINK, update=slow, read_bytes=8, write_bytes=8)
    r, u, w = 1e-4 + 8 * n * 1e-9, n * 1e-6, 2e-4 + 8 * n * 2e-9
    assert u >= r + w and math.isclose(t.seconds, r + m * u + w)  # read first, write last
    for update in (AlphaBeta(0, 1e-9), AlphaBeta(0, 1e-8), slow):
        serial = step_time([n] * m, tier=LINK, update=update, read_bytes=8, write_bytes=8,
                           prefetch=False)
        both = step_time([n] * m, tier=LINK, update=update, read_bytes=8, write_bytes=8)
        assert max(both.read + both.write, both.update) <= both.seconds <= serial.seconds
    io = [s for s in t.spans if s.lane == "io"]
    assert [(s.kind, s.chunk) for s in io[:5]] == [("read", 0), ("read", 1), ("write", 0),
                                                   ("read", 2), ("write", 1)]


def test_zero_infinity_bandwidth_claims():
    """§4.2 (Figure 3, peak 70 TFLOP/s, sequence 1024): 70 GB/s keeps parameters and
    gradients above 50 % at batch 1; optimizer states need ~1.5 TB/s for 90 % at batch 2."""
    peak = 70e12
    assert efficiency(arithmetic_intensity("params_grads", tokens=1024), 70e9, peak) > 0.5
    opt_ait = arithmetic_intensity("optimizer", tokens=2 * 1024)
    assert efficiency(opt_ait, 1.5e12, peak) > 0.9 > efficiency(opt_ait, 1.2e12, peak)
    assert math.isclose(efficiency(opt_ait, bandwidth_needed(0.9, opt_ait, peak), peak), 0.9)
    pcie4 = next(p.bytes_per_s for p in PUBLISHED if p.link.startswith("PCIe 4.0"))
    assert efficiency(opt_ait, pcie4, peak) < 0.2  # why ZeRO-Offload updates on the CPU
    assert iteration_flops(1e9, 1024) == 8 * 1e9 * 1024


def test_published_links_have_sources():
    assert all(p.source and p.bytes_per_s > 0 for p in PUBLISHED)
    speeds = [p.bytes_per_s for p in PUBLISHED]
    assert speeds == sorted(speeds, reverse=True)
