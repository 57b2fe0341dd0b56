"""Lab 07's laid-out cases show their mistakes whatever the grade's secret (labs/07_expert_parallel/
layouts.py): over 200 seeds each, in this process (no ranks), a "keep" case with layout "order"
has GShard's kept mask different from every wrong order's and from C + 1 slots', each of those
different from the others and named by the judge, and the fault file's keep fails with its
name; a "moe" case with layout "uneven" routes exactly as planned, with pieces of different
sizes between every pair of ranks and every rank receiving a number of rows other than it
sends, so that the fault file's unswapped backward is refused by `check_splits` on every rank.
"""

from __future__ import annotations

import itertools
import sys
import types

import pytest
import torch
from faultkit import ROOT, source

from autograder.grade import case_seed
from autograder.lab import CaseResult, load_lab
from autograder.protocol import CaseKey
from toolkit.cost.experts import rows_per_expert
from toolkit.expert_parallel import route

LAB_DIR = ROOT / "labs" / "07_expert_parallel"
FAULTS = ROOT / "tests" / "faults" / "07_expert_parallel"
SEEDS = 200
LAB = load_lab(LAB_DIR)
CHECKS = next(c for c in LAB.checks if c.call == "keep").judge.__globals__
EX = CHECKS["ex"]


def _laid_out(layout: str) -> list[tuple[CaseKey, dict]]:
    found = [(CaseKey(ci, k), case) for ci, check in enumerate(LAB.checks)
             for k, case in enumerate(check.cases) if case.get("layout") == layout]
    assert {c.visible for c in LAB.checks for case in c.cases if case.get("layout")} == \
        {True, False}, "laid-out cases among both the visible and the hidden checks"
    return found


def _seeded(key: CaseKey, case: dict) -> list[dict]:
    return [dict(case, seed=case_seed(secret, key, case["seed"])) for secret in range(SEEDS)]


def _student(fault: str) -> dict:
    """The reference with the fault file appended, run here (the later definitions win)."""
    module = types.ModuleType(f"_lab07_fault_{fault}")
    sys.modules[module.__name__] = module  # its dataclass looks itself up there
    exec(compile(source(fault, LAB_DIR / "moe_exchange.py", FAULTS), fault, "exec"),
         module.__dict__)
    return module.__dict__


ORDER = _laid_out("order")
UNEVEN = _laid_out("uneven")


@pytest.mark.parametrize("key, case", ORDER, ids=[str(k) for k, _ in ORDER])
def test_every_wrong_order_drops_other_choices(key, case):
    e, c = case["experts"], case["capacity"]
    reference, wrong = _student("capacity_off_by_one")["keep"], _student("wrong_drop_order")["keep"]
    for seeded in _seeded(key, case):
        expert = LAB.harness.make_inputs(seeded, 1)[0]["expert"]
        assert expert.shape == (case["tokens"], case["top_k"])
        assert all(len(set(row)) == case["top_k"] for row in expert.tolist())
        gshard = EX.kept(expert, e, c)
        masks = [EX.kept(expert, e, c + 1)] + [EX.kept_in_order(expert, e, c, **order)
                                               for order, _ in CHECKS["WRONG_ORDERS"]]
        for a, b in itertools.combinations([gshard] + masks, 2):
            assert not torch.equal(a, b), seeded["seed"]
        for mask, (_, why) in zip(masks[1:], CHECKS["WRONG_ORDERS"]):
            assert CHECKS["why_kept"](mask, expert, e, c) == \
                f"tokens dropped in the wrong order: {why}"
        result = CaseResult(seeded, 1, [{"expert": expert}], [{"kept": wrong(expert, e, c)}], [])
        verdict = CHECKS["judge_keep"](result)
        assert not verdict.passed and "slots counted token by token" in verdict.message
        assert "capacity off by one" in CHECKS["judge_keep"](
            CaseResult(seeded, 1, [{"expert": expert}], [{"kept": reference(expert, e, c)}],
                       [])).message


def _routings(case: dict, inputs: list[dict]) -> list:
    return [route(i["x"] @ i["router"].T, top_k=case["top_k"],
                  capacity_factor=case["capacity_factor"]) for i in inputs]


@pytest.mark.parametrize("key, case", UNEVEN, ids=[str(k) for k, _ in UNEVEN])
def test_every_pair_of_ranks_exchanges_uneven_pieces(key, case):
    p, e = case["world_size"], case["experts"]
    local = e // p
    student = _student("backward_splits_not_swapped")
    for seeded in _seeded(key, case):
        inputs = LAB.harness.make_inputs(seeded, p)
        routings = _routings(case, inputs)
        rows = rows_per_expert([rt.load().tolist() for rt in routings],
                               [rt.capacity for rt in routings])
        n = [[sum(rows[r][j * local:(j + 1) * local]) for j in range(p)] for r in range(p)]
        for r, j in itertools.permutations(range(p), 2):
            assert n[r][j] >= 1 and n[r][j] != n[j][r], (seeded["seed"], n)
        sent = [sum(row) for row in n]
        got = [sum(n[j][r] for j in range(p)) for r in range(p)]
        assert all(s != g for s, g in zip(sent, got)), (seeded["seed"], n)
        assert any(s > g for s, g in zip(sent, got)) and any(s < g for s, g in zip(sent, got))
        for r in range(p):  # combine's backward: the gradient has the S_r rows r got back
            grad = torch.zeros(sent[r], case["d"], dtype=torch.float64)
            with pytest.raises(ValueError, match="send it back with the splits swapped"):
                student["check_splits"](grad, [n[j][r] for j in range(p)], n[r], p)


def test_the_planned_routing_is_the_routers():
    """The router and x of an "uneven" case give exactly the planned experts (W·x = z)."""
    layouts = LAB.harness._layouts()
    for key, case in UNEVEN:
        p = case["world_size"]
        for seeded in _seeded(key, case)[:50]:
            seed = seeded["seed"]
            router, xs, planned = layouts.uneven(
                case, p, torch.Generator().manual_seed(seed),
                [torch.Generator().manual_seed(seed + 1 + r) for r in range(p)])
            inputs = [{"router": router, "x": x} for x in xs]
            for routing, experts in zip(_routings(case, inputs), planned):
                assert torch.equal(routing.expert, experts)
                assert (routing.gate[:, :-1] > routing.gate[:, 1:]).all()  # no tie in the top-k


def test_a_wrong_order_is_named_in_the_layer_check_too():
    """The layer check's kept choices use the same diagnosis as the keep check."""
    key, case = next((k, c) for k, c in UNEVEN if c["top_k"] > 1)
    judge = LAB.checks[key.check].judge
    wrong = _student("wrong_drop_order")["keep"]
    for seeded in _seeded(key, case):
        inputs = LAB.harness.make_inputs(seeded, case["world_size"])
        routing = _routings(case, inputs)[0]
        kept = wrong(routing.expert, case["experts"], routing.capacity)
        if not torch.equal(kept, routing.kept):
            result = CaseResult(seeded, case["world_size"], inputs, [{"kept": kept}], [])
            message = judge(result).message
            assert "rank 0's kept choices" in message and "slots counted token by token" in message
            return
    pytest.fail("no seed made token-by-token slots differ on rank 0")


def test_a_layout_that_cannot_hold_is_refused():
    keep = {"world_size": 1, "kind": "keep", "seed": 1, "tokens": 12, "experts": 4, "top_k": 2,
            "layout": "order"}
    with pytest.raises(ValueError, match="capacity >= 3"):
        LAB.harness.make_inputs(dict(keep, capacity=2), 1)
    moe = {"world_size": 4, "kind": "moe", "seed": 1, "experts": 4, "tokens": [8, 5, 7, 6], "d": 6,
           "f": 8, "top_k": 2, "capacity_factor": 1.0, "layout": "uneven"}
    with pytest.raises(ValueError, match="top_k <= experts per rank"):
        LAB.harness.make_inputs(moe, 4)
    with pytest.raises(ValueError, match="layout is None or 'order'"):
        LAB.harness.make_inputs(dict(keep, capacity=4, layout="uneven"), 1)
