"""Lab 05's expected values and the usual mistakes, for the judges in `checks.py`.

`expected` runs the dense layer in float64 with autograd on the same seeded weights, input and
upstream gradient the ranks used (`harness.make_inputs`), then slices the Megatron way (Shoeybi
et al., 2019, section 3): a column-parallel rank r owns rows r·o/p … (r+1)·o/p of ``weight`` and
``bias`` and that slice of the output; a row-parallel rank owns the same columns of ``weight``,
the whole bias and the whole output. Shard gradients are the slices of the dense gradients; the
input gradient is whole (column, MLP) or this rank's slice (row).

`diagnose` recomputes what each usual mistake would have returned (a split along the wrong
dimension, a bias not split or split when it must not be, the column output all-reduced, the
row bias added before the all-reduce, f missing, f and g swapped, GELU's tanh approximation...)
and names the first one the student's tensor matches.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from _lab_harness import DTYPES  # the lab's harness.py (loaded under this name)
from autograder import feedback
from autograder.feedback import close
from autograder.lab import CaseResult


def _cols(n: int, rank: int, p: int) -> slice:
    return slice(rank * n // p, (rank + 1) * n // p)


SHARDED = ("up.weight", "up.bias", "down.weight")
"""The MLP's tensors each rank receives only its shard of (zeros elsewhere: harness.make_inputs)."""


def dense_inputs(r: CaseResult) -> dict:
    """The case's dense tensors, in float64: an MLP's sharded ones summed over the ranks' inputs
    (the grader's own draws, never a rank's output), the others as every rank received them."""
    out = {k: v.double() for k, v in r.inputs[0].items()}
    if r.case["kind"] == "mlp":
        for k in SHARDED:
            if k in out:
                out[k] = sum(i[k].double() for i in r.inputs)
    return out


def _dense(r: CaseResult) -> dict:
    """Dense output and gradients in float64: keys as in the inputs, plus "y" and ".grad"s."""
    inputs = dense_inputs(r)
    leaves = {k: v.clone().requires_grad_() for k, v in inputs.items() if k not in ("gy",)}
    x, gy = leaves["x"], inputs["gy"]
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
    parts = {"up.": "column", "down.": "row"} if kind == "mlp" else {"": kind}
    for prefix, part in parts.items():
        for key in (prefix + "weight", prefix + "bias"):
            if key in dense:
                name = key[len(prefix):]
                want[key] = _shard(part, dense[key], name, rank, p)
                want[key + ".grad"] = _shard(part, dense[key + ".grad"], name, rank, p)
    dtype = DTYPES[r.case["dtype"]]
    return {k: v.to(dtype) for k, v in want.items()}


def like(got, t: torch.Tensor) -> bool:
    """`got` equals `t` within the tolerance of got's dtype."""
    return isinstance(got, torch.Tensor) and got.shape == t.shape and close(got, t.to(got.dtype))


def _shape_mistake(part: str, name: str, got, full: torch.Tensor, rank: int, p: int) -> str | None:
    """Name a shard of the wrong shape or slice: split dimension, transposed, not split."""
    if not isinstance(got, torch.Tensor):
        return None
    if name == "bias":
        if part == "column" and like(got, full):
            return ("the column-parallel bias is not sharded: rank r keeps only its out/p entries "
                    "(bias[r·out/p:(r+1)·out/p]), one for each output feature it computes")
        if part == "row" and got.numel() == full.numel() // p and got.numel() < full.numel():
            return ("the row-parallel bias was split, but it must not be: every rank keeps the "
                    "whole bias and adds it once, after the all-reduce")
        return None
    right = _shard(part, full, "weight", rank, p)
    other = _shard("row" if part == "column" else "column", full, "weight", rank, p)
    if like(got, full):
        return "the weight is not sharded: every rank keeps the whole dense weight"
    if like(got, other):
        which = ("columns (input features)", "rows (output features)")[part == "row"]
        should = ("rows, weight[r·out/p:(r+1)·out/p]" if part == "column"
                  else "columns, weight[:, r·in/p:(r+1)·in/p]")
        return (f"the weight shard is split along the wrong dimension: it holds {which}. "
                f"nn.Linear's weight is (out, in) = Aᵀ, so a {part}-parallel layer keeps "
                f"{should}")
    if like(got, right.t()) or like(got, other.t()):
        return (f"the weight shard is transposed ({tuple(got.shape)}, expected "
                f"{tuple(right.shape)}): keep nn.Linear's (out, in) layout and use F.linear")
    for j in range(p):
        if j != rank and like(got, _shard(part, full, "weight", j, p)):
            return f"rank {rank} holds rank {j}'s shard: rank r keeps slice r"
    return None


def _value_mistakes(r: CaseResult, rank: int,
                    dense: dict) -> dict[str, list[tuple[torch.Tensor, str]]]:
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
        if b is not None:
            out["y"].append((F.linear(dense["x"], w[rows]), "the bias is missing: add this "
                             "rank's slice of it to this rank's output features"))
        out["x_grad"] = [(dense["gy"][..., rows] @ w[rows], "the input gradient is only this "
                          "rank's part dL/dY_r·A_rᵀ: f must all-reduce it in backward")]
    if kind in ("row", "mlp"):
        b = dense.get("bias" if kind == "row" else "down.bias")
        if b is not None:
            out["y"] = [(y + (p - 1) * b, f"the row-parallel bias counts {p} times: it was added "
                         "on every rank before the all-reduce; add it once, after g"),
                        (y - b, "the row-parallel bias is missing on this rank: every rank adds "
                         "the whole bias once, after the all-reduce")]
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
        if like(got, wrong.to(dtype)):
            return why
    want = expected(r, rank)[key]
    if isinstance(got, torch.Tensor) and got.shape == want.shape and p > 1:
        if like(got, want * p):
            return f"{p}× too large: summed over the ranks once too often"
        if like(got, want / p):
            return f"{p}× too small: averaged instead of summed?"
    return None


def describe(got, want: torch.Tensor) -> str:
    if got is None:
        return "None (no gradient reached it: compute with the shard's nn.Parameter)"
    return feedback.describe(got, want)


def contributions(r: CaseResult, rank: int) -> dict[str, list[tuple[torch.Tensor, str]]]:
    """What rank `rank` may pass to its one all-reduce in each phase ("forward", "backward"),
    float64, each with what it is: its partial product (Megatron's g sums Σ_r Y_r) or its
    partial input gradient (f sums Σ_r dL/dY_r·A_rᵀ), from the grader's own inputs. A
    row-parallel partial product may carry b/p, or b on rank 0 (the bias then adds up to b
    once)."""
    kind, p = r.case["kind"], r.world_size
    if kind == "fg":
        return {"forward": [(r.inputs[rank]["x_g"].double(), "this rank's x (g's input)")],
                "backward": [(r.inputs[rank]["gy_f"].double(), "this rank's gradient (f's "
                                                                "input in backward)")]}
    dense = _dense(r)
    if kind == "column":
        rows = _cols(dense["weight"].shape[0], rank, p)
        return {"backward": [(dense["gy"][..., rows] @ dense["weight"][rows],
                              "this rank's partial input gradient dL/dY_r·A_rᵀ")]}
    b = dense.get("bias" if kind == "row" else "down.bias")
    if kind == "row":
        cols = _cols(dense["x"].shape[-1], rank, p)
        part = dense["x"][..., cols] @ dense["weight"][:, cols].t()
    else:
        part, grad = _mlp_rank_part(dense, rank, p)
    what = "this rank's partial product X_r·A_r" if kind == "row" else \
        "this rank's partial product GELU(X·A_r + b₁_r)·B_r"
    out = {"forward": [(part, what)]}
    if b is not None:  # the bias added before the sum, once in all: b/p each, or b on rank 0
        out["forward"] += [(part + b / p, what + " + b/p")] + \
            ([(part + b, what + " + b")] if rank == 0 else [])
    if kind == "mlp":
        out["backward"] = [(grad, "this rank's partial input gradient (through its own hidden "
                                  "units)")]
    return out
