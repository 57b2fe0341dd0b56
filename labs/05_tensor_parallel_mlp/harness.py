"""Lab 05's rank-side calls and inputs: how each check calls the student's layers.

Imported by the grader, which makes every rank's tensors with `make_inputs` from a seed derived
from the grade's secret, and copied into the sandbox (as `_lab_harness`), where each rank
receives its own alone. Holds no answers: each call builds the dense layer, asks the student's
`from_dense` for this rank's shard, runs forward and backward with the grader's upstream
gradient, and returns the shard, the output and every gradient; forward and backward are
sections the courier records apart (``layer.fwd`` / ``layer.bwd``; ``f.*`` and ``g.*`` for the
two operators), so the judges count each phase's collectives from the courier's record.

A case is a dict: ``world_size``, ``kind`` ("fg", "column", "row" or "mlp": which layer, also
for the "shards" call), ``h`` (input width), ``d`` (the output width of a layer, or d_ff of an
MLP), ``shape`` (the leading dimensions of the input, e.g. [2, 4] for batch ×
sequence), ``bias``, ``dtype`` and ``seed``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

DTYPES = {"float32": torch.float32, "float64": torch.float64}


class DenseMLP(nn.Module):
    """The unsplit MLP the checks shard: GELU(x·up_projᵀ + b₁)·down_projᵀ + b₂, h → d_ff → h
    (the same layout as TinyGPT's MLP in `toolkit.models`)."""

    def __init__(self, h: int, d_ff: int, bias: bool = True) -> None:
        super().__init__()
        with torch.device("meta"):  # no random init: make_inputs' weights are copied in
            self.up_proj, self.down_proj = nn.Linear(h, d_ff, bias), nn.Linear(d_ff, h, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.gelu(self.up_proj(x)))


def _randn(gen: torch.Generator, *shape: int, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(shape, generator=gen, dtype=torch.float64) * scale


def make_inputs(case: dict, world_size: int) -> list[dict]:
    """Per rank, the tensors of one case (float64 draws, cast to the case's dtype). Grader side
    only: every stream's seed is a hash of the case's seed and the stream's name
    (`autograder.seeds`), so the values one rank receives reveal no other rank's.

    Layers: the dense weight and bias (the same on every rank, drawn like PyTorch's default
    init scale 1/√fan_in), the input x and the upstream gradient gy (the loss is
    Σ output · gy). MLP: the dense MLP as rank r may see it: its own shard (rows r of up_proj's
    weight and bias, columns r of down_proj's weight, each drawn from rank r's own stream) and
    zeros in every other rank's, with down_proj's bias, x and gy whole; the dense MLP is the sum
    over ranks (`expected.dense_inputs`). A rank thus cannot compute the dense MLP alone. "fg":
    x_f (the same on every rank) and gy_f (different per rank) for f; x_g (different per rank)
    and gy_g (the same) for g."""
    from autograder.seeds import generator  # grader side: ranks never call make_inputs

    dtype = DTYPES[case.get("dtype", "float32")]
    seed, lead = int(case.get("seed", 0)), list(case.get("shape", [2, 4]))
    h, d = case.get("h", 8), case.get("d", 16)
    shared = generator(seed, "shared")
    if case["kind"] == "fg":
        x_f, gy_g = _randn(shared, *lead, h), _randn(shared, *lead, h)
        out = []
        for r in range(world_size):
            own = generator(seed, "rank", r)
            out.append({"x_f": x_f, "gy_f": _randn(own, *lead, h), "x_g": _randn(own, *lead, h),
                        "gy_g": gy_g})
        return [{k: v.to(dtype) for k, v in o.items()} for o in out]
    bias = case.get("bias", True)
    if case["kind"] == "mlp":
        whole = {"down.bias": _randn(shared, h, scale=0.5), "x": _randn(shared, *lead, h),
                 "gy": _randn(shared, *lead, h)}
        if not bias:
            del whole["down.bias"]
        return [{k: v.to(dtype) for k, v in {**whole, **_mlp_shard(seed, h, d, world_size, r,
                                                                    bias)}.items()}
                for r in range(world_size)]
    w = {"weight": _randn(shared, d, h, scale=h ** -0.5), "bias": _randn(shared, d, scale=0.5),
         "x": _randn(shared, *lead, h), "gy": _randn(shared, *lead, d)}  # one Linear(h, d)
    if not bias:
        del w["bias"]
    one = {k: v.to(dtype) for k, v in w.items()}
    return [one] * world_size


def _mlp_shard(seed: int, h: int, d: int, world_size: int, rank: int, bias: bool) -> dict:
    """Rank `rank`'s view of the MLP's sharded tensors: its shard drawn from its own stream,
    zeros in the other ranks' (see make_inputs)."""
    from autograder.seeds import generator

    own, mine, n = generator(seed, "shard", rank), _split(d, rank, world_size), d // world_size
    up_w, up_b = _randn(own, n, h, scale=h ** -0.5), _randn(own, n, scale=0.5)
    down_w = _randn(own, h, n, scale=d ** -0.5)
    w = {"up.weight": up_w.new_zeros(d, h), "up.bias": up_b.new_zeros(d),
         "down.weight": down_w.new_zeros(h, d)}
    w["up.weight"][mine], w["up.bias"][mine], w["down.weight"][:, mine] = up_w, up_b, down_w
    return w if bias else {k: v for k, v in w.items() if not k.endswith("bias")}


def _mine(call) -> dict:
    """This rank's inputs (drawn on the CPU by the grader, who computes the expected values
    from the same draw), on the rank's device."""
    return {k: v.to(call.device) for k, v in call.inputs.items()}


def _linear(weight: torch.Tensor, bias: torch.Tensor | None) -> nn.Linear:
    out_f, in_f = weight.shape
    with torch.device("meta"):
        layer = nn.Linear(in_f, out_f, bias is not None)
    layer.weight = nn.Parameter(weight.clone())
    layer.bias = nn.Parameter(bias.clone()) if bias is not None else None
    return layer


def _grad(p) -> torch.Tensor | None:
    return p.grad.detach().clone() if isinstance(p, torch.Tensor) and p.grad is not None else None


def _data(p) -> torch.Tensor | None:
    return p.detach().clone() if isinstance(p, torch.Tensor) else None


def _run(call, name: str, module, x: torch.Tensor, gy: torch.Tensor) -> dict:
    """Forward and backward of `module` on `x`, each phase a section of its own (``name.fwd``,
    ``name.bwd``). The backward runs only when the output has gy's shape (a wrong shape is
    reported, not crashed on)."""
    x = x.clone().requires_grad_()
    with call.section(f"{name}.fwd"):
        y = module(x)
    out = {"y": _data(y), "forward": True, "backward": False, "x_grad": None,
           "y_requires_grad": bool(getattr(y, "requires_grad", False))}
    if isinstance(y, torch.Tensor) and y.shape == gy.shape and y.requires_grad:
        with call.section(f"{name}.bwd"):
            (y * gy).sum().backward()
        out["backward"], out["x_grad"] = True, _grad(x)
    return out


def _params(prefix: str, layer) -> dict:
    out = {}
    for name in ("weight", "bias"):
        p = getattr(layer, name, None)
        out[f"{prefix}{name}"], out[f"{prefix}{name}.grad"] = _data(p), _grad(p)
    return out


def _split(n: int, rank: int, world_size: int) -> slice:
    step = n // world_size
    return slice(rank * step, (rank + 1) * step)


def _shaped(layer, kind: str, out_f: int, in_f: int, p: int, bias: bool) -> bool:
    """Whether `layer`'s shards have the shapes README.md specifies (column: weight (out/p, in),
    bias (out/p,); row: weight (out, in/p), bias (out,)). Checked the same way on every rank,
    so when they do not, every rank skips forward and the judge names the shard's mistake
    instead of a matmul error."""
    w_want = (out_f // p, in_f) if kind == "column" else (out_f, in_f // p)
    b_want = (out_f // p if kind == "column" else out_f,) if bias else None
    w, b = getattr(layer, "weight", None), getattr(layer, "bias", None)
    return (isinstance(w, torch.Tensor) and tuple(w.shape) == w_want
            and (tuple(b.shape) if isinstance(b, torch.Tensor) else None) == b_want)


def _shards(student, call):
    """Only `from_dense` (no forward, no communication): this rank's weight and bias."""
    i = _mine(call)
    cls = {"column": student.ColumnParallelLinear,
           "row": student.RowParallelLinear}[call.case["kind"]]
    return _params("", cls.from_dense(_linear(i["weight"], i.get("bias"))))


def _column(student, call):
    i, case, rank, world_size = _mine(call), call.case, call.rank, call.world_size
    layer = student.ColumnParallelLinear.from_dense(_linear(i["weight"], i.get("bias")))
    if not _shaped(layer, "column", case["d"], case["h"], world_size, "bias" in i):
        return _params("", layer)
    # The loss Σ_r Σ y_r · gy[.., rank's features] is the dense Σ y · gy, split by features.
    out = _run(call, "layer", layer, i["x"],
               i["gy"][..., _split(i["gy"].shape[-1], rank, world_size)])
    return {**out, **_params("", layer)}


def _row(student, call):
    i, case, rank, world_size = _mine(call), call.case, call.rank, call.world_size
    layer = student.RowParallelLinear.from_dense(_linear(i["weight"], i.get("bias")))
    if not _shaped(layer, "row", case["d"], case["h"], world_size, "bias" in i):
        return _params("", layer)
    x = i["x"][..., _split(i["x"].shape[-1], rank, world_size)]  # input arrives split
    return {**_run(call, "layer", layer, x, i["gy"]), **_params("", layer)}


def _mlp(student, call):
    i, case, world_size = _mine(call), call.case, call.world_size
    dense = DenseMLP(case["h"], case["d"], "up.bias" in i)
    dense.up_proj = _linear(i["up.weight"], i.get("up.bias"))
    dense.down_proj = _linear(i["down.weight"], i.get("down.bias"))
    mlp = student.ParallelMLP.from_dense(dense)
    up, down = getattr(mlp, "up_proj", None), getattr(mlp, "down_proj", None)
    h, d, bias = case["h"], case["d"], "up.bias" in i
    shards = {**_params("up.", up), **_params("down.", down)}
    if not (_shaped(up, "column", d, h, world_size, bias)
            and _shaped(down, "row", h, d, world_size, bias)):
        return shards
    out = _run(call, "layer", mlp, i["x"], i["gy"])
    held = _held(mlp) if isinstance(mlp, nn.Module) else -1
    # Read after backward: a shard's gradient, and whether any reached the dense MLP.
    return {**out, **_params("up.", up), **_params("down.", down), "numel": held,
            "dense_touched": any(p.grad is not None for p in dense.parameters())}


def _held(module: nn.Module) -> int:
    """Elements of every tensor `module` keeps: parameters, buffers and plain tensor attributes
    of it and its submodules, each tensor counted once (a kept copy of the dense MLP shows)."""
    seen, total = set(), 0
    for m in module.modules():
        for t in [*m._parameters.values(), *m._buffers.values(), *vars(m).values()]:
            if isinstance(t, torch.Tensor) and id(t) not in seen:
                seen.add(id(t))
                total += t.numel()
    return total


def _fg(student, call):
    i = _mine(call)
    f = _run(call, "f", student.copy_to_tp, i["x_f"], i["gy_f"])
    g = _run(call, "g", student.reduce_from_tp, i["x_g"].clone(), i["gy_g"])
    return {"f": f, "g": g}


CALLS = {"fg": _fg, "shards": _shards, "column": _column, "row": _row, "mlp": _mlp}
