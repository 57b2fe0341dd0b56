"""toolkit.data_parallel.fsdp_schedule and toolkit.widgets.fsdp: the simulated FSDP step adds up
without prefetch, hides communication with it for one more gathered unit, and converts recorded
collectives into ring bytes; the explorer's view and sliders."""

from __future__ import annotations

import pytest

from toolkit.cost import AlphaBeta, predict
from toolkit.data_parallel.fsdp_schedule import ring_wire_bytes, simulate_step
from toolkit.widgets.fsdp import fsdp_explorer, fsdp_view, step_inputs

LINK = AlphaBeta(alpha=1e-4, beta=1e-9)
ARGS = dict(units=4, world_size=4, unit_bytes=4e6, forward_s=3e-3, link=LINK)


def test_without_prefetch_everything_is_serial():
    s = simulate_step(**ARGS, prefetch=False)
    t_ag = float(predict("all_gather", "ring", 4e6, 4, LINK))
    t_rs = float(predict("reduce_scatter", "ring", 4e6, 4, LINK))
    assert s.step_time == pytest.approx(4 * (2 * t_ag + t_rs + 3e-3 + 6e-3))
    assert s.exposed_comm_time == pytest.approx(s.comm_time)
    assert s.peak_gathered_bytes == 4e6 and s.shard_bytes == 4 * 4e6 / 4
    kinds = [iv.kind for iv in s.intervals]
    assert kinds.count("all-gather") == 8 and kinds.count("reduce-scatter") == 4
    assert max(b for _, b in s.gathered_bytes()) == 4e6 and s.gathered_bytes()[-1][1] == 0


def test_prefetch_hides_gathers_for_a_second_unit():
    off, on = simulate_step(**ARGS, prefetch=False), simulate_step(**ARGS, prefetch=True)
    assert on.comm_time == pytest.approx(off.comm_time)  # same bytes, other times
    assert on.step_time < off.step_time and on.exposed_comm_time < off.exposed_comm_time
    assert on.peak_gathered_bytes == 2 * 4e6
    one = dict(ARGS, units=1)  # nothing to prefetch with a single unit
    assert simulate_step(**one, prefetch=True).step_time == pytest.approx(
        simulate_step(**one, prefetch=False).step_time)
    with pytest.raises(ValueError, match="units"):
        simulate_step(**dict(ARGS, units=0), prefetch=False)


def test_ring_wire_bytes_from_recorded_inputs():
    # all-gather: the recorder saw a 100-byte shard; the full tensor is 400 B, a ring sends 3/4
    assert ring_wire_bytes("all_gather_into_tensor", 100, 4) == 300
    assert ring_wire_bytes("reduce_scatter_tensor", 400, 4) == 300
    assert ring_wire_bytes("all_reduce", 400, 4) == 600
    assert ring_wire_bytes("send", 400, 4) == 0 and ring_wire_bytes("all_reduce", 400, 1) == 0


def test_view_and_explorer():
    unit_bytes, forward_s = step_inputs(psi=1e9, units=10, world_size=8, tokens=1000, tflops=100)
    assert unit_bytes == 2e8 and forward_s == pytest.approx(2 * 1e8 * 1000 / 1e14)
    fig, verdict, s = fsdp_view(psi=1e9, units=8, world_size=8, prefetch=True, bandwidth_gbs=25)
    assert len(fig.data) == 6 and "hidden behind compute" in verdict
    explorer = fsdp_explorer(units=4)
    before = explorer.verdict.value
    explorer.prefetch.value = True
    assert explorer.verdict.value != before and explorer.output.outputs
    with pytest.raises(ValueError, match="bandwidth_gbs"):
        fsdp_view(psi=1e9, units=8, world_size=8, prefetch=True, bandwidth_gbs=0)
