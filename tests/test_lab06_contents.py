"""Lab 06 judges what every all-reduce carried (labs/06_mixed_precision/traffic.py), not only its
bytes: red team 8 all-reduced bf16 zeros of exactly 2Ψ bytes and a zero flag, moved gradients
and flags through futexes on a library every rank maps, and scored 100. The filter now refuses
the shared futex wake (the `futex_channel` fault, graded on real ranks below), and the contents
judges fail such all-reduces whatever channel carried the data instead: tested here on the
courier's record built in-process from the grader's own inputs (no ranks), with every form of
the flag the README allows and the usual layouts of a correct solution passing."""

from __future__ import annotations

import re

import pytest
import torch
from faultkit import ROOT, assert_failed, assert_passed, run_grade, source, submission

from autograder.lab import CaseResult, load_lab
from autograder.protocol import Op, RankTraffic
from autograder.sandbox.rank import load_module

LAB_DIR = ROOT / "labs" / "06_mixed_precision"
FAULTS = ROOT / "tests" / "faults" / "06_mixed_precision"
LAB = load_lab(LAB_DIR)
checks = next(c for c in LAB.checks if c.call == "train").judge.__globals__  # checks.py's names
tr, ex = checks["tr"], checks["ex"]
harness = load_module(LAB_DIR / "harness.py", "_test_lab06_contents_harness")
BF16 = torch.bfloat16


def _op(rank: int, values: torch.Tensor, *, keep: bool = True) -> Op:
    v = values.contiguous().reshape(-1)
    data = v.view(torch.uint8).numpy().tobytes() if keep else None
    return Op(rank, 0, "all_reduce", None, v.numel() * v.element_size(),
              str(v.dtype).removeprefix("torch."), (v.numel(),), data=data)


def _result(case: dict, per_step) -> CaseResult:
    """A training case's record: `per_step(rank, t, grads, r)` → the tensors that rank
    all-reduced in step t (grads: its scaled local gradients there, float64 [weight, bias], or
    None where its loss overflowed), each inside the harness's ``step{t}`` section."""
    p = case["world_size"]
    r = CaseResult(case, p, harness.make_inputs(case, p), [None] * p, [])
    for rank in range(p):
        traffic, want = RankTraffic(rank), ex.local_gradients(r, rank)
        for t in range(case["steps"]):
            traffic.add(f"step{t}:begin")
            for values in per_step(rank, t, want[t], r):
                traffic.add(_op(rank, values))
            traffic.add(f"step{t}:end")
        r.traffic.append(traffic)
    return r


TRAIN = checks["case"]("train", 2, 1, **{**checks["TRAIN"], "overflow": [[1, 1]]})
PSI = TRAIN["d_out"] * (TRAIN["d_in"] + 1)


def _flat(grads, dtype=BF16) -> torch.Tensor:
    """The rank's bf16 buffer: its gradients, or infinities where its loss overflowed."""
    return torch.cat(grads).to(dtype) if grads is not None else torch.full((PSI,), float("inf"),
                                                                          dtype=dtype)


def _any_overflow(r: CaseResult, t: int) -> bool:
    return any(s == t for s, _ in r.case["overflow"])


def reference(rank, t, grads, r):  # the lab's reference: the flag taken after the sum
    return [_flat(grads), torch.tensor([float(_any_overflow(r, t))])]


def flag_first(rank, t, grads, r):  # the flag of its own gradients, before the sum
    return [torch.tensor([float(grads is None)]), _flat(grads)]


FAIR = {
    "reference": reference,
    "flag before the sum": flag_first,
    "flag riding in the gradients": lambda rank, t, g, r: [_flat(g)],
    "flag appended to the buffer": lambda rank, t, g, r: [
        torch.cat([_flat(g), torch.tensor([float(g is None)], dtype=BF16)])],
    "two float64 flags": lambda rank, t, g, r: [
        _flat(g), torch.tensor([float(_any_overflow(r, t))] * 2, dtype=torch.float64)],
    "an all-finite flag (MIN)": lambda rank, t, g, r: [
        _flat(g), torch.tensor([float(not _any_overflow(r, t))])],
    "divided by p first": lambda rank, t, g, r: [
        _flat(g) / r.world_size, torch.tensor([float(_any_overflow(r, t))])],
    "unscaled first": lambda rank, t, g, r: [
        _flat([x / ([r.case["init_scale"]] + ex.scales(r.case, ex.skipped(r.case)))[t]
               for x in g] if g is not None else None)],
    "float32 buffer (a bytes mistake, not a contents one)": lambda rank, t, g, r: [
        _flat(g, torch.float32)],
    "bias first, one all-reduce per parameter": lambda rank, t, g, r: (
        [g[1].to(BF16), g[0].to(BF16)] if g is not None else [_flat(g)]),
}


def test_a_bf16_backward_stays_well_inside_the_tolerance():
    """The contents tolerance (1/32 of the step's largest gradient) against what a correct
    rank computes: the harness's bf16 Linear, its bf16 inputs, the loss times the scale, at the
    reference's weights rounded to bf16, for every rank and step of the lab's training shapes
    over 20 seeds: the largest difference stays under half of it."""
    from torch import nn

    shapes = [checks["TRAIN"], {**checks["TRAIN"], "d_in": 10, "d_out": 5, "batch": 3}]
    worst = 0.0
    for seed in range(20):
        case = checks["case"]("train", 2, 1000 + seed, **shapes[seed % 2])
        r = CaseResult(case, 2, harness.make_inputs(case, 2), [None] * 2, [])
        ref, scale = ex.trajectory(r), [case["init_scale"]] + ex.scales(case, ex.skipped(case))
        for rank in range(2):
            for t, want in enumerate(ex.local_gradients(r, rank)):
                model = nn.Linear(case["d_in"], case["d_out"], dtype=BF16)
                with torch.no_grad():
                    for param, value in zip(model.parameters(),
                                            ex.rounded(ref[t - 1] if t else ex.start(r))):
                        param.copy_(value)
                x, y = r.inputs[rank]["x"][t].to(BF16), r.inputs[rank]["y"][t].float()
                (((model(x).float() - y) ** 2).mean() * scale[t]).backward()
                got = torch.cat([q.grad.reshape(-1) for q in model.parameters()]).double()
                big = float(torch.cat(want).abs().max())
                worst = max(worst, float((got - torch.cat(want)).abs().max()) / big)
    assert worst < tr.TOLERANCE / 2, worst


@pytest.mark.parametrize("layout", sorted(FAIR))
def test_every_correct_layout_and_flag_form_passes(layout):
    assert tr.judge_train_contents(_result(TRAIN, FAIR[layout])) is None


def _other_rank(rank, t, g, r):  # the mean a covert channel hands every rank, all-reduced
    other = ex.local_gradients(r, 1 - rank)[t]
    mean = [(a + b) / 2 for a, b in zip(g, other)] if g is not None and other is not None else g
    return [_flat(mean), torch.tensor([float(_any_overflow(r, t))])]


CHEATS = {
    "bf16 zeros and a zero flag (red team 8)": (
        lambda rank, t, g, r: [torch.zeros(PSI, dtype=BF16), torch.zeros(1)],
        [r"rank 0's all-reduce 1 in step 0 \(42 bytes of bfloat16\) carried neither its "
         r"gradients of a step nor an inf/NaN flag", r"element \d+ is 0, expected"]),
    "right gradients, a zero flag": (
        lambda rank, t, g, r: [_flat(g), torch.zeros(1)],
        [r"rank 1's inf/NaN flag at step 1 was \[0\.0\], which says none, though its own "
         r"gradients held an inf or NaN there"]),
    "the mean instead of its own": (_other_rank, [r"carried neither its gradients"]),
    "the previous step's gradients": (
        lambda rank, t, g, r: [_flat(ex.local_gradients(r, rank)[t - 1] if t else g)],
        [r"rank 0's all-reduces of step 3 did not carry its weight gradient"]),  # each a step late
    "an overflow nobody hears of": (
        lambda rank, t, g, r: [_flat(g).nan_to_num()],
        [r"rank 1's loss overflowed at step 1, and none of its all-reduces there said so"]),
    "no bias": (lambda rank, t, g, r: [g[0].to(BF16)] if g is not None else [_flat(g)],
                [r"rank 0's all-reduces of step 0 did not carry its bias gradient"]),
}


@pytest.mark.parametrize("cheat", sorted(CHEATS))
def test_all_reduces_that_do_not_carry_the_ranks_own_data_fail(cheat):
    per_step, says = CHEATS[cheat]
    verdict = tr.judge_train_contents(_result(TRAIN, per_step))
    assert verdict is not None and not verdict.passed
    for pattern in says:
        assert re.search(pattern, verdict.message), (pattern, verdict.message)


def test_a_flag_outside_every_step_an_unkept_buffer_and_a_flood_fail():
    r = _result(TRAIN, reference)
    r.traffic[0].add(_op(0, torch.zeros(1)))  # after the last step's section
    assert "was made outside train_step" in tr.judge_train_contents(r).message
    r = _result(TRAIN, reference)
    r.traffic[1].ops[0].data = None  # past the courier's keep limit
    assert "the courier kept no copy of its bytes" in tr.judge_train_contents(r).message
    r = _result(TRAIN, lambda rank, t, g, rr: reference(rank, t, g, rr) + [torch.ones(1)] * 8)
    assert re.search(r"rank 0 made 40 all-reduces in 4 steps",
                     tr.judge_train_contents(r).message)


def _one_call(case: dict, sent) -> CaseResult:
    """An unscale or reduce case whose rank r all-reduced `sent(r, its inputs)` once."""
    p = case["world_size"]
    r = CaseResult(case, p, harness.make_inputs(case, p), [None] * p, [])
    for rank in range(p):
        traffic = RankTraffic(rank)
        traffic.add(_op(rank, sent(rank, r.inputs[rank])))
        r.traffic.append(traffic)
    return r


UNSCALE = checks["case"]("unscale", 3, 120, shapes=[[3, 3], [2], [4]], scale=2.0 ** 14,
                         bad=[2, "nan"], none=1)


def test_unscales_flag_must_carry_the_ranks_own_finding():
    bad = UNSCALE["bad"][0]
    for fair in (lambda rank, i: torch.tensor([float(rank == bad)]),          # 0/1, MAX
                 lambda rank, i: torch.tensor([rank == bad]),                 # a bool
                 lambda rank, i: torch.tensor([0.0, float(rank == bad)],      # inf, NaN apart
                                              dtype=torch.float64),
                 lambda rank, i: torch.tensor([int(rank != bad)])):           # all finite, MIN
        assert tr.judge_unscale_contents(_one_call(UNSCALE, fair)) is None
    for cheat in (lambda rank, i: torch.zeros(1), lambda rank, i: torch.ones(1)):
        verdict = tr.judge_unscale_contents(_one_call(UNSCALE, cheat))
        assert verdict is not None and "inf/NaN flag was" in verdict.message


REDUCE = checks["case"]("reduce", 3, 130, shapes=[[2, 7], [7], [3, 3]], none=1)


def _grads(inputs: dict, order=(0, 2)) -> torch.Tensor:
    return torch.cat([inputs["g"][k].to(BF16).reshape(-1) for k in order])


def test_all_reduce_gradients_must_carry_the_ranks_own_gradients():
    p = REDUCE["world_size"]
    for fair in (lambda rank, i: _grads(i), lambda rank, i: _grads(i) / p,
                 lambda rank, i: _grads(i, (2, 0))):
        assert tr.judge_reduce_contents(_one_call(REDUCE, fair)) is None
    r = _one_call(REDUCE, lambda rank, i: torch.zeros(2 * 7 + 9, dtype=BF16))
    assert re.search(r"rank 0's all-reduce carried something other than its own gradients "
                     r"\(element \d+ is 0, expected", tr.judge_reduce_contents(r).message)
    mean = sum(_grads(i).double() for i in harness.make_inputs(REDUCE, p)) / p
    r = _one_call(REDUCE, lambda rank, i: mean.to(BF16))  # what a covert channel hands over
    assert "something other than its own gradients" in tr.judge_reduce_contents(r).message


@pytest.mark.multirank
def test_the_futex_channel_is_refused_and_scores_only_what_needs_no_collective(tmp_path):
    """Red team 8's `futex06` (100/100 before): the shared FUTEX_WAKE is refused, every check
    that all-reduces ends in the rank's PermissionError (sandbox_violation), and the grade keeps
    exactly the points
    of the checks that need no collective (masters, scaler)."""
    text = source("futex_channel", LAB_DIR / "mixed_precision.py", FAULTS)
    result, _ = run_grade(LAB, submission("futex_channel", tmp_path / "subs", text=text,
                                          name="mixed_precision.py"), tmp_path)
    alone = [c for c in result.checks if c.check.call in ("masters", "scaler")]
    for check in alone:
        assert_passed(check)
    for check in result.checks:
        if check not in alone:
            assert_failed(check, "sandbox_violation", r"PermissionError: .*shared FUTEX_WAKE "
                                                      r"refused: Operation not permitted",
                          r"the sandbox refused it")
    assert result.score == sum(c.check.points for c in alone) < 100
