"""toolkit.expert_parallel on real ranks: ExpertParallelMoE equals the single-process layer
(outputs, input gradients, router and expert gradients, router statistics) at 2, 3 and 4 ranks,
with uneven token counts (an empty rank among them), dropped tokens, top-1 and top-2, ragged and
padded buffers, all_to_all_single and isend/irecv; the recorder's bytes equal
`toolkit.cost.experts.step_bytes` to the byte; EP × DP on a 2 × 2 grid reduces expert gradients
over the edp group only and the router's over all four ranks.

`toolkit.experiments.expert_parallel.compare` runs each case (one launch per case) and holds the
single-process reference; these tests hold it to its numbers.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from toolkit.experiments.expert_parallel import all_to_all_support, compare
from toolkit.expert_parallel import ExpertParallelMoE, MoELayer, all_to_all
from toolkit.launch import spawn
from toolkit.planner import Layout

pytestmark = pytest.mark.multirank
TIMEOUT = 60
TOL = 1e-12  # float64


def _check(run, *, drops: bool) -> None:
    assert max(run.errors.values()) < TOL, run.errors
    assert run.stats.load == run.reference.load and run.stats.kept == run.reference.kept
    assert run.stats.dropped_tokens == run.reference.dropped_tokens
    assert (run.stats.dropped > 0) == drops
    t = run.traffic
    assert (t.forward_recorded == t.forward_formula).all(), t
    assert (t.backward_recorded == t.backward_formula).all(), t


@pytest.mark.parametrize("world_size, experts, tokens, top_k, pad, method", [
    (2, 4, [11, 6], 1, False, "all_to_all_single"),
    (2, 4, [11, 6], 2, True, "all_to_all_single"),
    (3, 6, [9, 0, 13], 2, False, "p2p"),
    (4, 4, [12, 7, 0, 9], 1, True, "p2p"),
    (4, 8, [12, 7, 5, 9], 2, False, "all_to_all_single"),
])
def test_equals_single_process_and_sends_the_formula(world_size, experts, tokens, top_k, pad,
                                                      method) -> None:
    run = compare(d_model=8, d_ff=12, num_experts=experts, top_k=top_k, capacity_factor=1.0,
                  tokens=tokens, pad=pad, method=method, seed=world_size, timeout=TIMEOUT)
    _check(run, drops=True)
    assert len(run.traffic) == world_size
    if pad:  # a padded buffer sends E·C rows whatever the routing
        caps = [-(-top_k * n // experts) for n in tokens]
        assert run.traffic.send_rows.tolist() == [experts * c for c in caps]
    else:
        assert run.traffic.send_rows.sum() == sum(run.stats.kept)


def test_no_drops_without_a_capacity() -> None:
    run = compare(d_model=8, d_ff=12, num_experts=4, top_k=2, capacity_factor=None,
                  tokens=[10, 3], timeout=TIMEOUT)
    _check(run, drops=False)
    assert run.traffic.send_rows.tolist() == [20, 6]  # every choice of every token


def test_ep_by_dp_on_a_two_by_two_grid() -> None:
    layout = Layout(dp=4, ep=2)
    assert layout.groups("ep") == [[0, 1], [2, 3]] and layout.groups("edp") == [[0, 2], [1, 3]]
    run = compare(d_model=8, d_ff=12, num_experts=4, top_k=2, capacity_factor=1.0,
                  tokens=[10, 7, 4, 9], layout=layout, method="p2p", timeout=TIMEOUT)
    _check(run, drops=True)
    expert_bytes = 2 * (2 * 8 * 12 + 12 + 8) * 8  # 2 experts' w1, b1, w2, b2 in float64
    router_bytes = 4 * 8 * 8
    for rank, ops in run.ops.items():
        ep_group = layout.groups("ep")[rank // 2]
        tokens_to = {peer for phase, op, peer, _ in ops if op == "isend"}
        assert tokens_to == set(ep_group) - {rank}  # tokens stay inside the ep group
        reduce = [(peer, n) for phase, op, peer, n in ops if phase == "reduce"]
        assert reduce == [(tuple(layout.groups("edp")[rank % 2]), expert_bytes),
                          ((0, 1, 2, 3), router_bytes)]


def test_gloo_all_to_all_forms() -> None:
    table = all_to_all_support(3, timeout=TIMEOUT)
    assert (table.loc["all_to_all_single"] == "works").all()
    assert (table.loc["isend/irecv (toolkit, method='p2p')"] == "works").all()


def _errors(rank: int, world_size: int) -> dict:
    out = {}
    moe = MoELayer(4, 8, 3, top_k=1)
    for key, call in (
        ("experts", lambda: ExpertParallelMoE.from_dense(moe)),
        ("method", lambda: ExpertParallelMoE.from_dense(MoELayer(4, 8, 2), method="alltoall")),
        ("splits", lambda: all_to_all(torch.zeros(3), [1, 1], [1, 1], group=dist.group.WORLD)),
    ):
        try:
            call()
            out[key] = None
        except ValueError as err:
            out[key] = str(err)
    return out


def test_errors_before_any_message() -> None:
    errors = spawn(_errors, 2, timeout=TIMEOUT, echo=False)[0]
    assert "3 experts cannot be shared by an expert-parallel group of 2" in errors["experts"]
    assert "method must be one of" in errors["method"]
    assert "in_splits must be counts >= 0 adding up to the 3 rows" in errors["splits"]
    with pytest.raises(ValueError, match="expected the world size 3"):  # before any launch
        compare(d_model=4, d_ff=4, num_experts=4, top_k=1, capacity_factor=1.0,
                tokens=[1, 2, 3], layout=Layout(dp=4, ep=2), timeout=TIMEOUT)
