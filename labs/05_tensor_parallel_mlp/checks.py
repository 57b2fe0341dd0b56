"""Lab 05's visible checks and the judges the hidden ones reuse.

Values: every rank's shard, output and gradients against `expected` (the dense layers in
float64, sliced as Megatron-LM splits them; `expected.py`), the first wrong one explained by
`diagnose`. Communication: all-reduces counted from the grader's courier over the whole case
(from_dense included), f = (0 forward, 1 backward), g = (1, 0), column = (0, 1), row = (1, 0),
MLP = (1, 1) (Shoeybi et al., 2019, section 3), each carrying this rank's partial result, and in
the MLP each one of one (.., h) activation. The harness's forward and backward sections are
marked by the rank, so they only name the phase in a message (red team 3: forged marks once
moved an all-reduce out of both).
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import torch

from _lab_harness import DTYPES  # the lab's harness.py (loaded under this name)
from autograder.feedback import close, kept_input
from autograder.sandbox.courier import KEEP_BYTES
from autograder.lab import CaseResult, Check, LabInfo, Verdict
from autograder.outputs import SCALAR, Either, Mapping, Maybe, Tensor
from autograder.sandbox.rank import load_module


# This folder's expected.py, loaded by path as the grader loads every lab file.
_expected = load_module(Path(__file__).with_name("expected.py"), "_autograder_lab_05_expected")
expected, diagnose, describe, like = (_expected.expected, _expected.diagnose,
                                      _expected.describe, _expected.like)
contributions = _expected.contributions

LAB = LabInfo(
    slug="05_tensor_parallel_mlp",
    title="Lab 05: the tensor-parallel MLP",
    student_files=("tp_mlp.py",),
    names=("copy_to_tp", "reduce_from_tp", "ColumnParallelLinear", "RowParallelLinear",
           "ParallelMLP"),
    forbidden_imports=("toolkit.tensor_parallel",),
    allowed_collectives=("all_reduce",),
)


def _form(case: dict, inputs: dict, rank: int, world_size: int):
    """Shards, outputs and gradients are shaped by the student's layers (the judges name a
    wrong shape, comparing shapes before values: `feedback.close`, `expected.like`): each is a
    tensor of at most every element this rank's inputs hold, p times (a shard not split), or
    a number; "fg" holds one such dict per operator."""
    most = world_size * sum(t.numel() for t in inputs.values()) + 64
    leaf = Mapping(Either(Maybe(Tensor(max_numel=most)), SCALAR))
    return {"f": leaf, "g": leaf} if case["kind"] == "fg" else leaf


# What each call's harness returns (`autograder.outputs`), checked before any judge reads it.
OUTPUTS = {name: _form for name in ("fg", "shards", "column", "row", "mlp")}

# (all-reduces in forward, in backward) of each piece, and what the forward one is for.
PHASES = {"fg.f": (0, 1), "fg.g": (1, 0), "column": (0, 1), "row": (1, 0), "mlp": (1, 1)}


def cases(kind: str, world_sizes, shapes=((2, 3),), *, h: int = 8, d: int = 16,
          dtype: str = "float32", bias: bool = True, seed: int = 0) -> tuple[dict, ...]:
    """Every (world size, leading shape), each with its own seed."""
    return tuple({"world_size": p, "kind": kind, "shape": list(s), "h": h, "d": d, "dtype": dtype,
                  "bias": bias, "seed": seed + k}
                 for k, (p, s) in enumerate(itertools.product(world_sizes, shapes)))


def _label(r: CaseResult) -> str:
    c = r.case
    size = f"h={c['h']}" + (f", d={c['d']}" if c["kind"] != "fg" else "")
    return (f"{r.world_size} ranks, input {tuple(c['shape']) + (c['h'],)}, {size}, "
            f"{c['dtype']}{'' if c.get('bias', True) else ', no bias'}")


WHAT = {"y": "the output", "x_grad": "the input's gradient"}


def _same(o):
    return o


def compare(r: CaseResult, keys: tuple[str, ...], out_of=lambda o: o) -> Verdict:
    """Every rank's `keys` (those the case has) against `expected`; the first wrong one named."""
    for rank in range(r.world_size):
        got_all, want_all = out_of(r.outputs[rank]), expected(r, rank)
        if not isinstance(got_all, dict):
            return Verdict(False, f"rank {rank} returned {type(got_all).__name__} ({_label(r)})")
        for key in (k for k in keys if k in want_all):
            got, want = got_all.get(key), want_all[key]
            if not close(got, want):
                what = WHAT.get(key, key)
                why = diagnose(r, rank, key, got)
                return Verdict(False, f"{what} on rank {rank}: " + (why or describe(got, want))
                               + f" ({_label(r)})")
            if key == "y" and got_all.get("y_requires_grad") is False:
                return Verdict(False, f"the output on rank {rank} does not require grad, so "
                                      f"no gradient reaches the input or the shards: keep the "
                                      f"computation in autograd ({_label(r)})")
    return Verdict(True)


HINT = {("forward", True): "one too many: f is the identity in forward, and a column-parallel "
                           "output needs no all-reduce (its slices are different features, not "
                           "partial sums)",
        ("forward", False): "g must all-reduce the row-parallel partial products in forward",
        ("backward", True): "one too many: g is the identity in backward",
        ("backward", False): "f must all-reduce the input's gradient in backward"}


def counts(r: CaseResult, parts, *, check_bytes: bool = False) -> Verdict:
    """The all-reduces `PHASES` gives for every (piece, section, out_of) of `parts`, and no
    other collective, on every rank, judged over the WHOLE case (`r.traffic[rank]`, bounded by
    the courier, which hands out the case and takes its output): one made in from_dense, or
    moved out of the harness's sections by forged marks, is counted. Each must carry one of this
    rank's contributions (`contents`), in any order. The sections ``section.fwd`` /
    ``section.bwd`` (marked by the rank) only say which phase a wrong count was in."""
    slots = [(piece, phase, f"{section}.{'fwd' if phase == 'forward' else 'bwd'}")
             for piece, section, _ in parts
             for phase, n in zip(("forward", "backward"), PHASES[piece]) for _ in range(n)]
    for rank in range(r.world_size):
        for _, _, out_of in parts:
            o = out_of(r.outputs[rank])
            for phase in ("forward", "backward"):
                if not (isinstance(o, dict) and o.get(phase) is True):
                    why = ("its shards do not have the shapes README.md gives, so forward was "
                           "not run (the from_dense check says more)" if isinstance(o, dict)
                           and "y" not in o else "no gradient flowed back through it")
                    return Verdict(False, f"rank {rank} did not get through {phase}: {why} "
                                          f"({_label(r)})")
        verdict = _count(r, rank, parts, len(slots))
        if verdict.passed and check_bytes:
            verdict = _sizes(r, rank)
        if verdict.passed:
            verdict = _matched(r, rank, slots)
        if not verdict.passed:
            return verdict
    return Verdict(True)


def _count(r: CaseResult, rank: int, parts, want: int) -> Verdict:
    """As many all-reduces in the whole case as `parts` expect, and no other collective; the
    message names the phase whose section is off, or says the extra ones lie outside both."""
    traffic = r.traffic[rank]
    got = traffic.calls.get("all_reduce", 0)
    if got == want and not set(traffic.calls) - {"all_reduce"}:
        return Verdict(True)
    inside = 0
    for piece, section, _ in parts:
        for phase, n in zip(("forward", "backward"), PHASES[piece]):
            rec = traffic.section(f"{section}.{'fwd' if phase == 'forward' else 'bwd'}")
            k = rec.calls.get("all_reduce", 0)
            inside += k
            if k != n or set(rec.calls) - {"all_reduce"}:
                return Verdict(False, f"{piece.split('.')[-1]}: rank {rank} made {k} "
                                      f"all-reduce(s) in {phase}, expected {n}: "
                                      f"{HINT[(phase, k > n)]} ({_label(r)})")
    return Verdict(False, f"rank {rank} made {got} all-reduce(s) in the case "
                          f"({dict(traffic.calls)}), expected {want}; {got - inside} of them "
                          f"outside forward and backward (from_dense, for one, must not "
                          f"communicate): every collective of the case counts ({_label(r)})")


def _sizes(r: CaseResult, rank: int) -> Verdict:
    """The MLP's all-reduces each pass one (.., h) activation of the case's dtype."""
    item = torch.empty(0, dtype=DTYPES[r.case["dtype"]]).element_size()
    nbytes = math.prod(r.case["shape"]) * r.case["h"] * item
    wrong = next((op for op in r.traffic[rank].ops if op.nbytes != nbytes), None)
    if wrong is None:
        return Verdict(True)
    phase = next((ph for ph, s in (("forward", "layer.fwd"), ("backward", "layer.bwd"))
                  if any(o is wrong for o in r.traffic[rank].section(s).ops)), None)
    return Verdict(False, f"rank {rank}'s {phase or 'case'} all-reduce passed in {wrong.nbytes} "
                          f"bytes; the MLP's is one (.., h) activation, {nbytes} bytes "
                          f"({_label(r)})")


def _matched(r: CaseResult, rank: int, slots) -> Verdict:
    """Every expected all-reduce (`slots`: piece, phase, section) matched by a distinct one of
    the case's, by contents; the one in the slot's own section is tried first (feedback)."""
    traffic, free = r.traffic[rank], [op for op in r.traffic[rank].ops
                                      if op.op == "all_reduce"]
    wants = contributions(r, rank)
    for piece, phase, section in slots:
        own = [op for op in traffic.section(section).ops if any(op is f for f in free)]
        order = own + [op for op in free if not any(op is o for o in own)]
        hit = next((op for op in order if _carries(op, wants[phase])), None)
        if hit is None:
            return contents(r, rank, phase, order[0], piece.split(".")[-1])
        free = [op for op in free if op is not hit]
    return Verdict(True)


def _carries(op, wants) -> bool:
    got = kept_input(op)  # in its own dtype: `like` applies that dtype's tolerance
    return got is not None and any(like(got, w.reshape(-1)) for w, _ in wants)


def contents(r: CaseResult, rank: int, phase: str, op, piece: str) -> Verdict:
    """Why all-reduce `op` does not carry this rank's own contribution to `phase`
    (`contributions`, from the grader's inputs), read from the courier's copy of its input: a
    decoy of the right size (zeros, while the rank computes the whole layer from the dense
    weights) fails."""
    if op.data is None:
        return Verdict(False, f"rank {rank}'s {phase} all-reduce could not be checked: the ranks "
                              f"had passed more than the courier keeps per launch "
                              f"({KEEP_BYTES >> 20} MiB) before it ({_label(r)})")
    got = kept_input(op)  # in its own dtype: `like` applies that dtype's tolerance
    first, what = contributions(r, rank)[phase][0]
    first = first.reshape(-1).to(got.dtype) if got is not None else first
    return Verdict(False, f"{piece}: rank {rank}'s {phase} all-reduce does not carry {what}: "
                          f"the all-reduce must sum the ranks' partial results (each rank "
                          f"computes only with its own shard); {describe(got, first)} "
                          f"({_label(r)})")


SHARDS = ("weight", "bias")
VALUES = ("y", "x_grad", "weight.grad", "bias.grad")
MLP_KEYS = ("up.weight", "up.bias", "down.weight", "down.bias", "y", "x_grad", "up.weight.grad",
            "up.bias.grad", "down.weight.grad", "down.bias.grad")


def judge_fg(r: CaseResult) -> Verdict:
    inputs, p = r.inputs, r.world_size
    sum_gy_f = sum(i["gy_f"].double() for i in inputs)
    sum_x_g = sum(i["x_g"].double() for i in inputs)
    for rank, o in enumerate(r.outputs):
        want = {"f": {"y": inputs[rank]["x_f"], "x_grad": sum_gy_f.to(inputs[0]["x_f"].dtype)},
                "g": {"y": sum_x_g.to(inputs[0]["x_g"].dtype), "x_grad": inputs[rank]["gy_g"]}}
        for op, name in (("f", "copy_to_tp (f)"), ("g", "reduce_from_tp (g)")):
            got = o.get(op) if isinstance(o, dict) else None
            for key, phase in (("y", "forward"), ("x_grad", "backward")):
                value = got.get(key) if isinstance(got, dict) else None
                w = want[op][key]
                if close(value, w):
                    continue
                swapped = {("f", "y"): like(value, sum(i["x_f"].double() for i in inputs)),
                           ("f", "x_grad"): like(value, inputs[rank]["gy_f"]),
                           ("g", "y"): like(value, inputs[rank]["x_g"]),
                           ("g", "x_grad"): like(value, p * inputs[rank]["gy_g"].double())}
                why = (f"looks like the other operator's {phase}: f is identity forward / "
                       f"all-reduce backward, g is all-reduce forward / identity backward"
                       if swapped[(op, key)] else describe(value, w))
                return Verdict(False, f"{name} {phase} on rank {rank}: {why} ({_label(r)})")
    return counts(r, tuple((f"fg.{op}", op, lambda o, op=op: o.get(op) if isinstance(o, dict)
                            else None) for op in ("f", "g")))


def judge_shards(r: CaseResult) -> Verdict:
    return compare(r, SHARDS)


def judge_layer(r: CaseResult) -> Verdict:
    verdict = compare(r, SHARDS + VALUES)
    return verdict if not verdict.passed else counts(r, ((r.case["kind"], "layer", _same),))


def judge_mlp(r: CaseResult) -> Verdict:
    return compare(r, MLP_KEYS)


def judge_mlp_traffic(r: CaseResult) -> Verdict:
    return counts(r, (("mlp", "layer", _same),), check_bytes=True)


def judge_mlp_memory(r: CaseResult) -> Verdict:
    """Each rank holds (h·d + d)/p + d·h/p + h elements of tensors (the row bias is whole)."""
    c, p = r.case, r.world_size
    h, d = c["h"], c["d"]
    want = (h * d + d * c["bias"]) // p + d * h // p + h * c["bias"]
    values = judge_mlp(r)
    if not values.passed:
        return values
    for rank, o in enumerate(r.outputs):
        if o.get("dense_touched"):
            return Verdict(False, f"rank {rank}'s parallel MLP sends gradients into the dense "
                                  f"MLP's parameters: the shards must be copies ({_label(r)})")
        if o.get("numel") != want:
            return Verdict(False, f"rank {rank}'s ParallelMLP keeps {o.get('numel')} tensor "
                                  f"elements (parameters, buffers, tensor attributes); "
                                  f"its shard is (h·d + d)/p + d·h/p + h = {want} ({_label(r)})")
    return Verdict(True)


CHECKS = [
    Check("copy_to_tp (f) and reduce_from_tp (g): values, gradients, one all-reduce each", 8,
          "fg", cases("fg", (2, 4), seed=0), judge_fg,
          about="f: identity forward, all-reduce backward; g: all-reduce forward, identity "
                "backward."),
    Check("from_dense: a column shard keeps rows of weight and bias, a row shard columns", 5,
          "shards", cases("column", (4,), h=8, d=16, seed=10) + cases("column", (4,), h=12, d=8,
                                                                      seed=11)
          + cases("row", (4,), h=16, d=8, seed=12) + cases("row", (4,), h=8, d=12, seed=13),
          judge_shards, about="Only from_dense runs: rank r's weight and bias against the dense "
                              "layer's slice r."),
    Check("ColumnParallelLinear: output slice, gradients, no all-reduce forward, one backward", 7,
          "column", cases("column", (2, 4), seed=20), judge_layer,
          about="Loss Σ y·gy over the rank's output features; x's gradient must be whole."),
    Check("RowParallelLinear: shards, whole output, gradients, one all-reduce forward", 8, "row",
          cases("row", (2, 4), seed=30), judge_layer,
          about="The input arrives split by features; the bias is whole on every rank."),
    Check("ParallelMLP: output equals the dense MLP's; every shard's gradient is its slice", 7,
          "mlp", cases("mlp", (2, 4), seed=40), judge_mlp),
    Check("ParallelMLP: exactly one all-reduce in forward and one in backward", 5, "mlp",
          cases("mlp", (2, 4), seed=50), judge_mlp_traffic,
          about="Counted over the whole case by the grader's recorder, with its bytes "
                "(one (.., h) activation each)."),
]
