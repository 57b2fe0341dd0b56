"""Lab 03's judges name the usual mistakes: fed outputs that a buggy submission would return
(built here from the single-process reference, no ranks started), each verdict fails with the
words a student needs; the reference's own outputs pass."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from autograder.lab import CaseResult, load_lab
from autograder.protocol import Op, RankTraffic

LAB = load_lab(Path(__file__).resolve().parents[1] / "labs" / "03_sharded_optimizer")
import _lab_harness as harness  # noqa: E402  (registered by load_lab)

checks = next(c for c in LAB.checks if c.call == "zero").judge.__globals__  # checks.py's names
W = 2
ZERO = {"world_size": W, "dims": [7, 5, 3], "frozen": ["0.bias"], "seed": 0, "optimizer": "sgd"}
FSDP = {"world_size": W, "dims": [5, 6, 3], "frozen": [], "seed": 3}
CALLS = {"all_gather_single": 2 * 2 * 2, "reduce_scatter_single": 2 * 2}  # 2 units, 2 steps


def _traffic(rank: int, calls: dict[str, int]) -> RankTraffic:
    """A rank's traffic as the courier would record these calls (sizes do not matter here)."""
    t = RankTraffic(rank)
    for op, n in calls.items():
        for _ in range(n):
            t.add(Op(rank, len(t.ops), op, None, 0, "float32", ()))
    return t


def _result(case, outputs, calls=None):
    traffic = [_traffic(r, dict(calls or {})) for r in range(case["world_size"])]
    return CaseResult(case, case["world_size"], harness.make_inputs(case, case["world_size"]),
                      outputs, traffic)


def _zero_outputs(scale=1.0, state_bytes=100):
    model = checks["reference"](ZERO, steps=3, optimizer="sgd", grad_scale=scale)
    params = {k: v.detach().float() for k, v in model.state_dict().items()}
    return [{"params": params, "state_bytes": state_bytes}] * W


def _fsdp_outputs(scale=1.0, held=0, swap=False):
    flat = checks["_flat"]
    out = [{"init_shards": [], "shards": [], "held_after_forward": held} for _ in range(W)]
    init = checks["_linears"](harness.make_model(FSDP))
    trained = checks["_linears"](checks["reference"](FSDP, steps=2, optimizer="plain_sgd",
                                                     grad_scale=scale))
    for key, layers in (("init_shards", init), ("shards", trained)):
        for layer in layers:
            v = flat(layer).float()
            size = math.ceil(v.numel() / W)
            v = torch.cat([v, v.new_zeros(W * size - v.numel())])
            chunks = [v[r * size:(r + 1) * size] for r in range(W)]
            if swap and key == "init_shards":
                chunks = chunks[::-1]
            for r in range(W):
                out[r][key].append(chunks[r])
    return out


def test_the_right_outputs_pass():
    assert checks["judge_zero"](_result(ZERO, _zero_outputs())).passed
    assert checks["judge_fsdp_traffic"](_result(FSDP, _fsdp_outputs(), CALLS)).passed


@pytest.mark.parametrize("verdict, words", [
    (lambda: checks["judge_zero"](_result(ZERO, _zero_outputs(scale=W))), "summed"),
    (lambda: checks["judge_fsdp"](_result(FSDP, _fsdp_outputs(scale=W))), "summed"),
    (lambda: checks["judge_state"](_result(dict(ZERO, optimizer="adam", frozen=[]),
                                           _zero_outputs(state_bytes=8 * 58))),
     "steps on the full tensor"),
    (lambda: checks["judge_fsdp"](_result(FSDP, _fsdp_outputs(swap=True))), "wrong shard offsets"),
    (lambda: checks["judge_fsdp_traffic"](_result(FSDP, _fsdp_outputs(held=232), CALLS)),
     "still held 232 bytes of gathered parameters after forward"),
    (lambda: checks["judge_fsdp_traffic"](_result(FSDP, _fsdp_outputs(),
                                                  {**CALLS, "all_reduce": 2})),
     "FSDP reduce-scatters the gradient"),
])
def test_usual_mistakes_are_named(verdict, words):
    v = verdict()
    assert not v.passed and words in v.message, v.message


def _split_bounds(n: int, p: int, r: int) -> list[int]:
    """A student's shard_bounds that cuts as torch.tensor_split does (empty chunks included)."""
    sizes = [n // p + (k < n % p) for k in range(p)]
    return [sum(sizes[:r]), sum(sizes[:r + 1])]


@pytest.mark.parametrize("sizes", [[7], [1, 7, 12, 13], [2, 3, 5, 1000]])
def test_uneven_bounds_are_called_uneven(sizes):
    """The rows the harness returns for the check's own sizes (n = 1 over p = 2 gives an empty
    chunk first): the message names tensor_split's uneven chunks."""
    rows = []
    for n in sizes:
        for p in (1, 2, 3, 4):
            size = math.ceil(n / p)
            flat = torch.zeros(p * size)
            flat[:n] = torch.arange(float(n))
            rows.append({"numel": n, "world_size": p, "flat": flat,
                         "bounds": [_split_bounds(n, p, r) for r in range(p)]})
    v = checks["judge_bounds"](_result({"world_size": 1, "sizes": sizes}, [rows]))
    assert not v.passed and "tensor_split's uneven chunks" in v.message, v.message
