"""Every rank's result is checked against the form its lab declares before any judge reads it
(issue 30: lab 06's judges broadcast a (2²¹, 1, 1) result against the reference, 5.4 GB of the
grader): shapes, dtypes, lengths and keys, linear in the result, no arithmetic; what the form
does not declare is dropped. Every lab declares a form for every call its checks make."""

from __future__ import annotations

import re

import pytest
import torch

from autograder.judging import judge_case
from autograder.lab import CaseResult, Check, Verdict, find_lab, load_lab
from autograder.outputs import (SCALAR, Either, Float, Mapping, Maybe, OutputError, Seq,
                                Tensor, conform, state_form)
from autograder.protocol import RankTraffic

LABS = ["01_collectives", "02_ddp", "03_sharded_optimizer", "04_pipeline_schedule",
        "05_tensor_parallel_mlp", "06_mixed_precision", "07_expert_parallel"]


def test_shapes_dtypes_lengths_and_keys_are_checked_and_the_rest_dropped():
    form = {"w": Tensor((3, 6), frozenset({"float32"})), "rows": Seq(int, 2),
            "free": Tensor(max_numel=4), "maybe": Maybe(bool), "pair": [float, str]}
    good = {"w": torch.zeros(3, 6), "rows": [1, 2], "free": torch.zeros(2, 2), "maybe": None,
            "pair": (1, "x"), "extra": torch.zeros(10**6)}
    got = conform(good, form)
    assert set(got) == {"w", "rows", "free", "maybe", "pair"}  # "extra" never reaches a judge
    for bad, words in [
            ({**good, "w": torch.zeros(1 << 21, 1, 1)}, "at ['w']: shape (2097152, 1, 1), "
                                                        "expected (3, 6)"),
            ({**good, "w": torch.zeros(3, 6, dtype=torch.float64)}, "a float64 tensor"),
            ({**good, "rows": [1, 2, 3]}, "at ['rows']: 3 items, expected 2"),
            ({**good, "rows": [1, True]}, "at ['rows'][1]: expected int"),
            ({**good, "free": torch.zeros(5)}, "5 elements (shape (5,)); at most 4"),
            ({k: v for k, v in good.items() if k != "rows"}, "no 'rows' in it"),
            ({**good, "pair": [1]}, "at ['pair']: 1 items, expected 2")]:
        with pytest.raises(OutputError, match=re.escape(words)):
            conform(bad, form)


def test_maybe_either_mapping_and_state_dicts():
    assert conform({"a": 1}, {"a": int, "b": Maybe(int)}) == {"a": 1}  # an optional key
    assert conform("repr", Either(Seq(str), str)) == "repr"
    assert conform({"k": 1.5, "j": None}, Mapping(SCALAR)) == {"k": 1.5, "j": None}
    with pytest.raises(OutputError, match="expected a number or text"):
        conform({"k": [1]}, Mapping(SCALAR))
    form = state_form(torch.nn.Linear(3, 2).state_dict())
    assert set(conform({"weight": torch.zeros(2, 3), "bias": torch.zeros(2)}, form)) == \
        {"weight", "bias"}
    with pytest.raises(ValueError, match="give its shape, or max_numel"):
        Tensor()


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_a_number_is_finite_unless_its_form_says_otherwise(bad):
    """Red team 8: a NaN passed a judge testing `abs(got - want) > tol` (False for NaN). The
    forms `float` and SCALAR refuse NaN and ±inf; `Float(nonfinite=True)` holds them."""
    for form in (float, Float(), SCALAR, Seq(float, 2), {"s": Mapping(SCALAR)}):
        value = [1.0, bad] if isinstance(form, Seq) else {"s": {"k": bad}} \
            if isinstance(form, dict) else bad
        with pytest.raises(OutputError, match="a finite number expected"):
            conform(value, form)
    assert repr(conform(bad, Float(nonfinite=True))) == repr(bad)
    assert conform(0.25, float) == 0.25 and conform(3, float) == 3 and conform(2.5, SCALAR) == 2.5
    with pytest.raises(OutputError, match="expected a number"):
        conform(True, Float(nonfinite=True))


def test_a_result_without_its_form_is_not_judged():
    judged = []

    def judge(r):
        judged.append(r.outputs)
        return Verdict(True)

    check = Check("c", 1, "call", ({"world_size": 2},), judge)
    form = lambda case, inputs, rank, p: Tensor((3,))  # noqa: E731
    ok = CaseResult({}, 2, [None, None], [torch.zeros(3), torch.zeros(3)],
                    [RankTraffic(0), RankTraffic(1)])
    assert judge_case(check, ok, form).passed and len(judged) == 1
    bad = CaseResult({}, 2, [None, None], [torch.zeros(3), torch.zeros(1 << 21, 1, 1)],
                     [RankTraffic(0), RankTraffic(1)])
    v = judge_case(check, bad, form)
    assert not v.passed and len(judged) == 1  # the judge never saw it
    assert "rank 1's result does not have the form the lab's harness returns (nothing of it " \
        "was judged): shape (2097152, 1, 1), expected (3,)" in v.message


@pytest.mark.parametrize("slug", LABS)
def test_every_lab_declares_the_form_of_every_call(slug):
    lab = load_lab(find_lab(slug))
    calls = {c.call for c in lab.checks}
    assert calls <= set(lab.outputs), f"{slug}: no form for {sorted(calls - set(lab.outputs))}"
    assert set(lab.outputs) <= set(lab.harness.CALLS)
