"""Lab 02's traffic hint names the mistake from the model itself: a weight tied under any
attribute name, in any dtype, and frozen parameters sent along; assign_buckets is judged on the
case's sizes and caps, never on what the rank's rows say; no ranks started."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from autograder.lab import CaseResult, load_lab
from toolkit.data_parallel.buckets import assign_buckets

LAB = load_lab(Path(__file__).resolve().parents[1] / "labs" / "02_ddp")
import _lab_harness as harness  # noqa: E402  (registered by load_lab)

checks = next(c for c in LAB.checks if c.call == "train").judge.__globals__  # checks.py's names
hint = checks["tr"].bytes_hint


def nbytes(ps) -> int:
    return sum(p.numel() * p.element_size() for p in ps)


class Tied(nn.Module):
    """An embedding and a head sharing one weight under names other than the lab's toy's."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.embed = nn.Linear(6, 6, dtype=dtype)
        self.out = nn.Linear(6, 6, bias=False, dtype=dtype)
        self.out.weight = self.embed.weight


def test_a_tied_weight_sent_twice_is_named_whatever_its_name_and_dtype():
    for dtype in (torch.float32, torch.bfloat16, torch.float64):
        model = Tied(dtype)
        trainable = nbytes(model.parameters())
        twice = trainable + model.embed.weight.numel() * model.embed.weight.element_size()
        assert "tied weight was sent twice" in hint(model, twice)
        assert hint(model, trainable + 4) == ""          # a count no mistake explains
    toy = harness.make_model({"tied": True})              # the lab's own toy (attribute c)
    twice = nbytes(toy.parameters()) + nbytes([toy.c.weight])
    assert "tied weight was sent twice" in hint(toy, twice)


def test_frozen_parameters_sent_are_named_and_an_untied_model_gets_no_tied_hint():
    model = harness.make_model({"frozen": ["a.bias"]})
    every = nbytes(model.parameters())
    assert "frozen parameters were sent" in hint(model, every)
    untied = harness.make_model({})
    assert hint(untied, 2 * nbytes(untied.parameters())) == ""


CASE = {"world_size": 1, "sizes": [[100, 100, 300], [5, 7]], "caps": [1000, 1]}


def _buckets(rows) -> bool:
    return checks["judge_buckets"](CaseResult(CASE, 1, [None], [rows], []))


def _right_rows() -> list[dict]:
    return [{"buckets": assign_buckets([torch.zeros(n) for n in sizes], cap)}
            for sizes in CASE["sizes"] for cap in CASE["caps"]]


def test_buckets_are_judged_on_the_case_sizes():
    """The right buckets, one row per (sizes, cap) of the case, pass; no rows (a stub whose
    harness call was replaced: lab02_bucket_rows) fail; a row naming sizes of its own (10**12
    elements: lab02_bucket_rows_memory) is judged on the case's sizes, never allocated."""
    assert _buckets(_right_rows()).passed
    v = _buckets([])
    assert not v.passed and "4 in all; got 0 rows" in v.message, v.message
    forged = [{"sizes": [10**12], "cap": 1, "buckets": [[0]]}] * 4
    v = _buckets(forged)
    said = "of [400, 400, 1200] bytes, cap_bytes=1000) gave [[0]], expected [[2], [1, 0]]"
    assert not v.passed and said in v.message, v.message
    v = _buckets(_right_rows() * 75)  # lab02_bucket_rows_time: extra rows are refused
    assert not v.passed and "got 300 rows" in v.message, v.message


def test_an_all_reduce_carries_a_bucket_in_any_layout_or_over_p():
    """A bucket's flat buffer may lay its parameters out in any order, and may be divided by
    p before the all-reduce (as torch's DDP does); anything else is no bucket's gradient."""
    carries = checks["tr"]._carries
    a, b = torch.tensor([1.0, -2.0, 3.0], dtype=torch.float64), torch.tensor([0.5, 4.0],
                                                                            dtype=torch.float64)
    assert carries(torch.cat([a, b]), [a, b], 2) and carries(torch.cat([b, a]), [a, b], 2)
    assert carries(torch.cat([a, b]) / 2, [a, b], 2)
    assert not carries(torch.cat([a, b]) * 2, [a, b], 2)          # summed twice: no
    assert not carries(torch.zeros(5, dtype=torch.float64), [a, b], 2)  # a decoy of zeros
    assert not carries(torch.cat([a, b])[:4], [a, b], 2) and not carries(None, [a, b], 2)
