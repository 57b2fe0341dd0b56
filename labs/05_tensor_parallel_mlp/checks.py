"""Lab 05's visible checks and the judges the hidden ones reuse.

Expected values come from the dense layer in float64 with autograd, on the same seeded weights,
input and upstream gradient the ranks used (`harness.make_inputs`), then sliced the Megatron way
(Shoeybi et al., 2019, section 3): a column-parallel rank r owns rows r·o/p … (r+1)·o/p of
``weight`` and ``bias`` and that slice of the output; a row-parallel rank owns the same columns
of ``weight``, the whole bias, and the whole output. Gradients of the shards are the slices of
the dense gradients; the input gradient is whole (column, MLP) or this rank's slice (row).
Collectives are counted per phase: f = (0 forward, 1 backward), g = (1, 0), MLP = (1, 1).
When a value is wrong, `diagnose` tries the usual mistakes and names the first that fits.
"""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F

from _lab_harness import DTYPES  # the lab's harness.py (loaded under this name)
from autograder.feedback import close
from autograder.lab import CaseResult, Check, LabInfo, Verdict

LAB = LabInfo(
    slug="05_tensor_parallel_mlp",
    title="Lab 05: the tensor-parallel MLP",
    student_files=("tp_mlp.py",),
    names=("copy_to_tp", "reduce_from_tp", "ColumnParallelLinear", "RowParallelLinear",
           "ParallelMLP"),
    forbidden_imports=("toolkit.tensor_parallel",),
    allowed_collectives=("all_reduce",),
)

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


def _cols(n: int, rank: int, p: int) -> slice:
    return slice(rank * n // p, (rank + 1) * n // p)


def _dense(r: CaseResult) -> dict:
    """Dense output and gradients in float64: keys as in the inputs, plus "y" and ".grad"s."""
    leaves = {k: v.double().clone().requires_grad_() for k, v in r.inputs[0].items()
              if k not in ("gy",)}
    x, gy = leaves["x"], r.inputs[0]["gy"].double()
    if r.case["kind"] == "mlp":
        hidden = F.linear(x, leaves["up.weight"], leaves.get("up.bias"))
        y = F.linear(F.gelu(hidden), leaves["down.weight"], leaves.get("down.bias"))
    else:
        y = F.linear(x, leaves["weight"], leaves.get("bias"))
    (y * gy).sum().backward()
    out = {"y": y.detach(), "gy": gy}
    for k, v in leaves.items():
        out[k], out[f"{k}.grad"] = v.detach(), v.grad
    return out


def _shard(kind: str, full: torch.Tensor, name: str, rank: int, p: int) -> torch.Tensor:
    """The slice of a dense tensor that rank `rank` of a `kind` layer owns."""
    if kind == "column" and name in ("weight", "bias", "y"):
        return full[_cols(full.shape[0], rank, p)] if name != "y" else \
            full[..., _cols(full.shape[-1], rank, p)]
    if kind == "row" and name in ("weight", "x"):
        return full[..., _cols(full.shape[-1], rank, p)]
    return full


def expected(r: CaseResult, rank: int) -> dict:
    """What rank `rank` should return (the harness's keys), in the case's dtype."""
    dense, p, kind = _dense(r), r.world_size, r.case["kind"]
    want = {"y": _shard(kind, dense["y"], "y", rank, p),
            "x_grad": _shard(kind, dense["x.grad"], "x", rank, p)}
    for prefix, part in ({"up.": "column", "down.": "row"} if kind == "mlp" else {"": kind}).items():
        for key in (prefix + "weight", prefix + "bias"):
            if key in dense:
                name = key[len(prefix):]
                want[key] = _shard(part, dense[key], name, rank, p)
                want[key + ".grad"] = _shard(part, dense[key + ".grad"], name, rank, p)
    dtype = DTYPES[r.case["dtype"]]
    return {k: v.to(dtype) for k, v in want.items()}


def _like(got, t: torch.Tensor) -> bool:
    """`got` equals `t` within the tolerance of got's dtype."""
    return isinstance(got, torch.Tensor) and got.shape == t.shape and close(got, t.to(got.dtype))


def _shape_mistake(part: str, name: str, got, full: torch.Tensor, rank: int, p: int) -> str | None:
    """Name a shard of the wrong shape or slice: split dimension, transposed, not split."""
    if not isinstance(got, torch.Tensor):
        return None
    if name == "bias":
        if part == "column" and _like(got, full):
            return ("the column-parallel bias is not sharded: rank r keeps only its out/p entries "
                    "(bias[r·out/p:(r+1)·out/p]), one for each output feature it computes")
        if part == "row" and got.numel() == full.numel() // p and got.numel() < full.numel():
            return ("the row-parallel bias was split, but it must not be: every rank keeps the "
                    "whole bias and adds it once, after the all-reduce")
        return None
    right = _shard(part, full, "weight", rank, p)
    other = _shard("row" if part == "column" else "column", full, "weight", rank, p)
    if _like(got, full):
        return "the weight is not sharded: every rank keeps the whole dense weight"
    if _like(got, other):
        which = ("columns (input features)", "rows (output features)")[part == "row"]
        should = ("rows, weight[r·out/p:(r+1)·out/p]" if part == "column"
                  else "columns, weight[:, r·in/p:(r+1)·in/p]")
        return (f"the weight shard is split along the wrong dimension: it holds {which}. "
                f"nn.Linear's weight is (out, in) = Aᵀ, so a {part}-parallel layer keeps {should}")
    if _like(got, right.t()) or _like(got, other.t()):
        return (f"the weight shard is transposed ({tuple(got.shape)}, expected "
                f"{tuple(right.shape)}): keep nn.Linear's (out, in) layout and use F.linear")
    for j in range(p):
        if j != rank and _like(got, _shard(part, full, "weight", j, p)):
            return f"rank {rank} holds rank {j}'s shard: rank r keeps slice r"
    return None


def _value_mistakes(r: CaseResult, rank: int, dense: dict) -> dict[str, list[tuple[torch.Tensor, str]]]:
    """Per output key, wrong answers the usual mistakes give, each with its explanation."""
    p, kind = r.world_size, r.case["kind"]
    y, out = dense["y"], {}
    if kind == "column":
        rows = _cols(y.shape[-1], rank, p)
        w, b = dense["weight"], dense.get("bias")
        mine = lambda x: F.linear(x, w[rows], None if b is None else b[rows])  # noqa: E731
        out["y"] = [(sum(_shard("column", y, "y", j, p) for j in range(p)),
                     "the column-parallel output was all-reduced: its p slices are different "
                     "output features, not partial sums, so it needs no communication in forward"),
                    (mine(p * dense["x"]), "the input was all-reduced in forward: f is the "
                     "identity in forward and all-reduces in backward (f and g swapped?)")]
        out["x_grad"] = [(dense["gy"][..., rows] @ w[rows], "the input gradient is only this "
                          "rank's part dL/dY_r·A_rᵀ: f must all-reduce it in backward")]
    if kind in ("row", "mlp"):
        b = dense.get("bias" if kind == "row" else "down.bias")
        if b is not None:
            out["y"] = [(y + (p - 1) * b, f"the row-parallel bias counts {p} times: it was added "
                         "on every rank before the all-reduce; add it once, after g")]
        if kind == "row":
            cols = _cols(dense["x"].shape[-1], rank, p)
            part = dense["x"][..., cols] @ dense["weight"][:, cols].t()
            out["x_grad"] = [(p * dense["x.grad"][..., cols], f"{p}× too large: the input's "
                              "gradient was all-reduced, but g's backward is the identity")]
            out.setdefault("y", []).extend(
                [(part, "the output is only this rank's partial product: g must all-reduce it"),
                 (part + (0 if b is None else b), "the output is this rank's partial product "
                  "plus the bias: g must all-reduce the partial products (then add the bias)")])
    if kind == "mlp":
        _, part_grad = _mlp_rank_part(dense, rank, p)
        out.setdefault("y", []).extend(_mlp_misplaced(dense, rank, p))
        out["x_grad"] = [(part_grad, "the input gradient is only this rank's part (through its "
                          "own hidden units): f must all-reduce it in backward")]

        def dense_with(act):
            leaves = {k: dense[k] for k in ("x", "up.weight", "up.bias", "down.weight", "down.bias")
                      if k in dense}
            hidden = F.linear(leaves["x"], leaves["up.weight"], leaves.get("up.bias"))
            return F.linear(act(hidden), leaves["down.weight"], leaves.get("down.bias"))
        out.setdefault("y", []).extend([
            (dense_with(lambda t: F.gelu(t, approximate="tanh")),
             "the output matches GELU's tanh approximation: use the exact GELU (F.gelu(x))"),
            (dense_with(torch.relu), "the output matches a ReLU MLP: the dense MLP uses GELU"),
            (dense_with(lambda t: t), "the output matches the MLP without its activation: apply "
             "GELU between up_proj and down_proj")])
    return out


def _mlp_rank_part(dense: dict, rank: int, p: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank r's own share of the MLP, GELU(X·A_r)·B_r (no bias b₂), and the input gradient
    through it alone (what a missing f leaves)."""
    cols = _cols(dense["up.weight"].shape[0], rank, p)
    x = dense["x"].clone().requires_grad_()
    up_b = dense.get("up.bias")
    hidden = F.linear(x, dense["up.weight"][cols], None if up_b is None else up_b[cols])
    y = F.linear(F.gelu(hidden), dense["down.weight"][:, cols])
    (y * dense["gy"]).sum().backward()
    return y.detach(), x.grad


def _mlp_misplaced(dense: dict, rank: int, p: int) -> list[tuple[torch.Tensor, str]]:
    """MLP outputs of a misplaced all-reduce: on the column output, or f and g swapped."""
    d = dense["up.weight"].shape[0]
    up_b, b2 = dense.get("up.bias"), dense.get("down.bias")
    hidden = F.linear(dense["x"], dense["up.weight"], up_b)
    summed = sum(hidden[..., _cols(d, j, p)] for j in range(p))  # all-reduced column output
    down_sum = sum(dense["down.weight"][:, _cols(d, j, p)] for j in range(p))
    on_column = F.linear(F.gelu(summed), down_sum, b2)
    cols = _cols(d, rank, p)
    swapped = F.linear(F.gelu(F.linear(p * dense["x"], dense["up.weight"][cols],
                                       None if up_b is None else up_b[cols])),
                       dense["down.weight"][:, cols], b2)
    return [(on_column, "the column-parallel output (the d_ff/p hidden features) was "
             "all-reduced: those are different features, not partial sums; the only forward "
             "all-reduce is g's, after the row-parallel layer"),
            (swapped, "the output looks like f and g swapped: the input was summed over the "
             "ranks (p·x) and the row-parallel partial products were not; f goes before the "
             "column-parallel layer, g after the row-parallel one")]


def diagnose(r: CaseResult, rank: int, key: str, got) -> str | None:
    """The usual mistake that explains `got` for `key` on `rank`, or None."""
    p, kind, dense = r.world_size, r.case["kind"], _dense(r)
    part, name = (kind, key) if kind != "mlp" else (
        ("column" if key.startswith("up.") else "row"), key.split(".", 1)[-1])
    dtype = DTYPES[r.case["dtype"]]
    if name == "bias.grad" and part == "row" and (got is None or not got.abs().any()):
        return ("the row-parallel bias gets no gradient on this rank: every rank must add its "
                "copy of the bias (after the all-reduce), so every copy gets the gradient")
    if not isinstance(got, torch.Tensor):
        return None
    if name in ("weight", "bias") and key in dense:
        return _shape_mistake(part, name, got, dense[key].to(dtype), rank, p)
    for wrong, why in _value_mistakes(r, rank, dense).get(key, []):
        if _like(got, wrong.to(dtype)):
            return why
    want = expected(r, rank)[key]
    if isinstance(got, torch.Tensor) and got.shape == want.shape and p > 1:
        if _like(got, want * p):
            return f"{p}× too large: summed over the ranks once too often"
        if _like(got, want / p):
            return f"{p}× too small: averaged instead of summed?"
    return None


def _describe(got, want: torch.Tensor) -> str:
    if got is None:
        return "None (no gradient reached it: compute with the shard's nn.Parameter)"
    if not isinstance(got, torch.Tensor):
        return f"a {type(got).__name__}, expected a tensor"
    if got.shape != want.shape:
        return f"shape {tuple(got.shape)}, expected {tuple(want.shape)}"
    if got.dtype != want.dtype:
        return f"dtype {got.dtype}, expected {want.dtype}"
    diff = (got.double() - want.double()).abs().reshape(-1)
    i = int(diff.argmax())
    return f"element {i} is {got.reshape(-1)[i].item():.6g}, expected {want.reshape(-1)[i].item():.6g}"


WHAT = {"y": "the output", "x_grad": "the input's gradient"}


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
                return Verdict(False, f"{what} on rank {rank}: " + (why or _describe(got, want))
                               + f" ({_label(r)})")
            if key == "y" and got_all.get("y_requires_grad") is False:
                return Verdict(False, f"the output on rank {rank} does not require grad, so "
                                      f"no gradient reaches the input or the shards: keep the "
                                      f"computation in autograd ({_label(r)})")
    return Verdict(True)


def counts(r: CaseResult, piece: str, out_of=lambda o: o, *, check_bytes: bool = False) -> Verdict:
    """One all-reduce (and no other collective) where `PHASES` says, on every rank."""
    fwd_want, bwd_want = PHASES[piece]
    hint = {("forward", True): "one too many: f is the identity in forward, and a "
                               "column-parallel output needs no all-reduce (its slices are "
                               "different features, not partial sums)",
            ("forward", False): "g must all-reduce the row-parallel partial products in forward",
            ("backward", True): "one too many: g is the identity in backward",
            ("backward", False): "f must all-reduce the input's gradient in backward"}
    for rank in range(r.world_size):
        o = out_of(r.outputs[rank])
        for phase, want in (("forward", fwd_want), ("backward", bwd_want)):
            rec = o.get("fwd" if phase == "forward" else "bwd") if isinstance(o, dict) else None
            if not isinstance(rec, dict):
                why = ("its shards do not have the shapes README.md gives, so forward was not "
                       "run (the from_dense check says more)" if isinstance(o, dict)
                       and "y" not in o else "no gradient flowed back through it")
                return Verdict(False, f"rank {rank} did not get through {phase}: {why} "
                                      f"({_label(r)})")
            calls = {k: v for k, v in rec.get("calls", {}).items()}
            got = calls.get("all_reduce", 0)
            if got != want or set(calls) - {"all_reduce"}:
                return Verdict(False, f"{piece.split('.')[-1]}: rank {rank} made {got} "
                                      f"all-reduce(s) in {phase}, expected {want}: "
                                      f"{hint[(phase, got > want)]} ({_label(r)})")
            if check_bytes and want:
                lead = 1
                for n in r.case["shape"]:
                    lead *= n
                nbytes = lead * r.case["h"] * torch.empty(0, dtype=DTYPES[r.case["dtype"]]).element_size()
                if rec.get("bytes") != nbytes:
                    return Verdict(False, f"rank {rank}'s {phase} all-reduce passed in "
                                          f"{rec.get('bytes')} bytes; the MLP's is one (.., h) "
                                          f"activation, {nbytes} bytes ({_label(r)})")
    return Verdict(True)


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
                swapped = {("f", "y"): _like(value, sum(i["x_f"].double() for i in inputs)),
                           ("f", "x_grad"): _like(value, inputs[rank]["gy_f"]),
                           ("g", "y"): _like(value, inputs[rank]["x_g"]),
                           ("g", "x_grad"): _like(value, p * inputs[rank]["gy_g"].double())}
                why = (f"looks like the other operator's {phase}: f is identity forward / "
                       f"all-reduce backward, g is all-reduce forward / identity backward"
                       if swapped[(op, key)] else _describe(value, w))
                return Verdict(False, f"{name} {phase} on rank {rank}: {why} ({_label(r)})")
    for op in ("f", "g"):
        verdict = counts(r, f"fg.{op}", lambda o, op=op: o.get(op) if isinstance(o, dict) else None)
        if not verdict.passed:
            return verdict
    return Verdict(True)


def judge_shards(r: CaseResult) -> Verdict:
    return compare(r, SHARDS)


def judge_layer(r: CaseResult) -> Verdict:
    verdict = compare(r, SHARDS + VALUES)
    return verdict if not verdict.passed else counts(r, r.case["kind"])


def judge_mlp(r: CaseResult) -> Verdict:
    return compare(r, MLP_KEYS)


def judge_mlp_traffic(r: CaseResult) -> Verdict:
    return counts(r, "mlp", check_bytes=True)


def judge_mlp_memory(r: CaseResult) -> Verdict:
    """Each rank holds (h·d + d)/p + d·h/p + h parameters (the row bias is whole)."""
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
            return Verdict(False, f"rank {rank}'s ParallelMLP has {o.get('numel')} parameters; "
                                  f"its shard is (h·d + d)/p + d·h/p + h = {want} ({_label(r)})")
    return Verdict(True)


CHECKS = [
    Check("copy_to_tp (f) and reduce_from_tp (g): values, gradients, one all-reduce each", 8,
          "fg", cases("fg", (2, 4), seed=0), judge_fg,
          about="f: identity forward, all-reduce backward; g: all-reduce forward, identity backward."),
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
          about="Counted per phase by the grader's recorder, with its bytes (one (.., h) activation)."),
]
