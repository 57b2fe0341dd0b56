"""Lab 07's messages are judged by their rows (issue 19, pass 3): `checks.judge_rows` reads the
courier's copy of every float64 message and compares each (phase, sender, receiver) with the
rows `expected.rows_between` computes from the grader's inputs, in any order. Here the traffic
is built by hand from those rows: as sent it passes (also split in two messages and shuffled),
with one row of zeros (a decoy of the right size) or one row missing it fails. The real
ranks' traffic is compared on every grade of the reference (test_autograder.py's full marks)."""

from __future__ import annotations

import torch

from autograder.grade import CaseKey, case_seed
from autograder.lab import CaseResult, find_lab, load_lab
from autograder.protocol import Op, RankTraffic

LAB = load_lab(find_lab("07_expert_parallel"), hidden=False)
CHECKS = LAB.checks[0].judge.__globals__  # the visible checks' module (judge_rows, ex)
CASE = {"world_size": 2, "kind": "moe", "experts": 4, "tokens": [9, 6], "d": 6, "f": 8,
        "top_k": 2, "capacity_factor": 1.0, "seed": case_seed(7, CaseKey(3, 0), 1)}


def _traffic(rows: dict, p: int, change=None) -> list[RankTraffic]:
    out = []
    for rank in range(p):
        t = RankTraffic(rank)
        for phase in ("forward", "backward"):
            t.add(f"{phase}:begin")
            for peer in (j for j in range(p) if j != rank):
                block = rows[(phase, rank, peer)]
                if change:
                    block = change(phase, rank, peer, block)
                block = block[torch.randperm(len(block))]
                for part in (block[: len(block) // 2], block[len(block) // 2:]):
                    t.add(Op(rank, len(t.ops), "send", peer, part.numel() * 8, "float64",
                             tuple(part.shape), data=part.contiguous().numpy().tobytes()))
            t.add(f"{phase}:end")
        out.append(t)
    return out


def _result(change=None) -> tuple[CaseResult, dict]:
    inputs = LAB.harness.make_inputs(CASE, 2)
    r = CaseResult(CASE, 2, inputs, [None, None], [])
    ref = CHECKS["ex"].reference(r)
    rows = CHECKS["ex"].rows_between(r, ref)
    assert sum(len(v) for v in rows.values()) > 0
    r.traffic = _traffic(rows, 2, change)
    return r, ref


def test_the_rows_as_sent_pass_in_any_order():
    r, ref = _result()
    assert CHECKS["judge_rows"](r, ref).passed


def test_a_row_of_zeros_fails_and_names_the_pair():
    def zero_first(phase, rank, peer, block):
        if (phase, rank, peer) == ("forward", 1, 0) and len(block):
            block = block.clone()
            block[0] = 0
        return block
    r, ref = _result(zero_first)
    verdict = CHECKS["judge_rows"](r, ref)
    assert not verdict.passed
    assert "rank 1's float64 messages to rank 0 in forward do not carry" in verdict.message


def test_a_missing_row_fails():
    def drop(phase, rank, peer, block):
        return block[1:] if (phase, rank, peer) == ("backward", 0, 1) else block
    r, ref = _result(drop)
    verdict = CHECKS["judge_rows"](r, ref)
    assert not verdict.passed and "rank 0's float64 messages to rank 1 in backward" in \
        verdict.message
