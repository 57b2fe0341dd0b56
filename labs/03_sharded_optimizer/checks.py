"""Lab 03's visible checks (students have these) and the judges the hidden ones reuse.

Judges run in the grader. Expected parameters come from training the same seeded model in one
process, in float64, on the whole batch (every rank had an equal slice, so the sharded run must
apply the *mean* gradient). Memory is read from what the ranks measured (bytes of the inner
optimizer's state tensors; gathered parameters alive after forward) and traffic from the
grader's courier: calls per operation (``reduce_scatter_tensor`` and ``reduce_scatter_single``
are one operation, as are ``all_gather_into_tensor`` and ``all_gather_single``). ZeRO §5.1-5.3
and §7.2 (Rajbhandari et al., SC 2020): stage 2 keeps Kψ/N_d bytes of optimizer state per rank;
stage 3 all-gathers each unit twice and reduce-scatters its gradient once per step.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from _lab_harness import OPTIMIZERS, make_data, make_model  # the lab's harness.py
from autograder.lab import CaseResult, Check, LabInfo, Verdict

LAB = LabInfo(
    slug="03_sharded_optimizer",
    title="Lab 03: a sharded optimizer and FSDP from scratch",
    student_files=("sharding.py",),
    names=("shard_bounds", "flatten_padded", "ShardedOptimizer", "FSDPLinear", "GatheredLinear"),
    forbidden_imports=("toolkit.data_parallel",),
    allowed_collectives=("all_gather_into_tensor", "reduce_scatter_tensor", "all_reduce",
                         "broadcast"),
)

# The operations the courier counts: torch 2.13 routes reduce_scatter_tensor and
# all_gather_into_tensor (deprecated) to these, so either name counts as one call.
RS, AG = "reduce_scatter_single", "all_gather_single"
NAMES = {RS: "reduce_scatter_tensor / reduce_scatter_single",
         AG: "all_gather_into_tensor / all_gather_single"}
STATE_BYTES_PER_ELEMENT = {"sgd": 4, "adam": 8}  # momentum; Adam's exp_avg + exp_avg_sq (fp32)
SHARE_SLACK = 1.25  # "≈ 1/N_d": a rank may hold up to 25 % more than an even flat shard


def cases(call_cases, seed: int = 0, **extra) -> tuple[dict, ...]:
    """One case per (world_size, dims, frozen), each with its own seed."""
    return tuple({"world_size": p, "dims": list(dims), "frozen": list(frozen), "seed": seed + k,
                  **extra} for k, (p, dims, frozen) in enumerate(call_cases))


def _label(r: CaseResult) -> str:
    frozen = f", frozen {', '.join(r.case['frozen'])}" if r.case.get("frozen") else ""
    return f"{r.world_size} ranks, layers {r.case['dims']}{frozen}"


def reference(case: dict, *, steps: int, optimizer: str, grad_scale: float = 1.0) -> nn.Module:
    """The seeded model trained in one process, float64, on the whole batch. `grad_scale`
    = world_size gives what a run that *sums* gradients over ranks would reach."""
    model = make_model(case).double()
    x, y = (t.double() for t in make_data(case))
    _, cls, options = OPTIMIZERS[optimizer]
    opt = cls([p for p in model.parameters() if p.requires_grad], **options)
    for _ in range(steps):
        opt.zero_grad()
        (grad_scale * F.mse_loss(model(x), y)).backward()
        opt.step()
    return model


def _calls(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} × {NAMES.get(op, op)}" for op, n in counts.items())


def _close(got, want: torch.Tensor) -> bool:
    return (isinstance(got, torch.Tensor) and got.shape == want.shape
            and torch.allclose(got.double(), want, rtol=1e-4, atol=2e-5))


def _mismatch(states: list, want: dict[str, torch.Tensor]) -> tuple[int, str] | None:
    """(rank, parameter name) of the first parameter that differs, or None."""
    for rank, state in enumerate(states):
        for name, value in want.items():
            if not isinstance(state, dict) or not _close(state.get(name), value):
                return rank, name
    return None


# -- shard_bounds and flatten_padded --------------------------------------------------------

def _bounds_hint(bounds, n: int, p: int) -> str:
    """Name the usual mistake: uneven chunks (torch.tensor_split's, empty ones included, or
    any other that covers exactly the n elements) instead of p equal padded shards."""
    sizes = [len(c) for c in torch.arange(n).tensor_split(p)]
    starts = [sum(sizes[:k]) for k in range(p)]
    split = [[a, a + k] for a, k in zip(starts, sizes)]
    equal = " here every rank holds the same S = ⌈n/p⌉ elements and the last shards end in padding."
    if bounds == split:
        return f" Those are torch.tensor_split's uneven chunks:{equal}"
    rows = [b for b in bounds if isinstance(b, list) and len(b) == 2]
    if len(rows) == p and rows[0][0] == 0 and rows[-1][1] == n and all(
            rows[k][1] == rows[k + 1][0] for k in range(p - 1)):
        return (" Those chunks cover exactly the n elements, unevenly (as torch.tensor_split "
                f"cuts them):{equal}")
    return " Rank r's shard starts at r·S, S = ⌈n/p⌉."


def judge_bounds(r: CaseResult) -> Verdict:
    rows = r.outputs[0]
    if not isinstance(rows, list):
        return Verdict(False, f"expected plain results, got {str(rows)[:80]}")
    for row in rows:
        n, p = row["numel"], row["world_size"]
        size = math.ceil(n / p)
        want = [[k * size, (k + 1) * size] for k in range(p)]
        if row["bounds"] != want:
            return Verdict(False, f"shard_bounds({n}, {p}, r) for r = 0..{p - 1} gave "
                                  f"{row['bounds']}, expected {want}."
                                  f"{_bounds_hint(row['bounds'], n, p)}")
        flat = torch.zeros(p * size)
        flat[:n] = torch.arange(n, dtype=torch.float32)
        got = row["flat"]
        if not (isinstance(got, torch.Tensor) and got.shape == flat.shape
                and torch.equal(got, flat)):
            shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
            return Verdict(False, f"flatten_padded([arange({n})], {p}) gave {shape}, expected "
                                  f"{p}·⌈{n}/{p}⌉ = {p * size} elements: the values, then zeros")
    return Verdict(True)


# -- ShardedOptimizer -----------------------------------------------------------------------

def judge_zero(r: CaseResult) -> Verdict:
    opt, steps = r.case.get("optimizer", "sgd"), r.case.get("steps", 3)
    outputs = [o.get("params") if isinstance(o, dict) else None for o in r.outputs]
    model = reference(r.case, steps=steps, optimizer=opt)
    want = {k: v.detach() for k, v in model.state_dict().items()}
    bad = _mismatch(outputs, want)
    if bad is None:
        return Verdict(True)
    rank, name = bad
    init = make_model(r.case).state_dict()
    got = outputs[rank].get(name) if isinstance(outputs[rank], dict) else None
    where = f"rank {rank}, parameter {name} ({_label(r)}, {opt}, {steps} steps)"
    if name in r.case.get("frozen", ()):
        return Verdict(False, f"{where}: a frozen parameter (requires_grad=False) changed; "
                              "leave frozen parameters out of the flat shards")
    if opt == "sgd":
        summed = reference(r.case, steps=steps, optimizer=opt, grad_scale=r.world_size)
        if _mismatch(outputs, {k: v.detach() for k, v in summed.state_dict().items()}) is None:
            return Verdict(False, f"the parameters match a run whose gradients were *summed* over "
                                  f"the {r.world_size} ranks ({_label(r)}): divide the "
                                  "reduce-scattered gradient by the world size to average it")
    if isinstance(got, torch.Tensor) and _close(got, init[name].double()):
        return Verdict(False, f"{where}: still the initial value: copy the all-gathered "
                              "parameters back into the model after the step")
    return Verdict(False, f"{where} differs from single-process training: check the shard "
                          "offsets when slicing the flat vector and when copying it back")


def judge_state(r: CaseResult) -> Verdict:
    opt = r.case.get("optimizer", "adam")
    per = STATE_BYTES_PER_ELEMENT[opt]
    model = make_model(r.case)
    n = sum(p.numel() for p in model.parameters() if p.requires_grad)
    full, even = per * n, per * math.ceil(n / r.world_size)
    got = [o.get("state_bytes") if isinstance(o, dict) else None for o in r.outputs]
    for rank, b in enumerate(got):
        if not isinstance(b, int) or b < 0:
            return Verdict(False, f"rank {rank}: self.optimizer is not a torch optimizer; "
                                  "build it on your shard in __init__")
        if b == 0:
            return Verdict(False, f"rank {rank} holds no optimizer state after stepping "
                                  f"({_label(r)}): did the inner optimizer step?")
        if b >= full:
            return Verdict(False, f"rank {rank} holds {b:,} bytes of {opt} state, the whole "
                                  f"model's {full:,}: it steps on the full tensor, not on its "
                                  f"1/{r.world_size} shard ({even:,} bytes) ({_label(r)})")
        if b > SHARE_SLACK * even:
            return Verdict(False, f"rank {rank} holds {b:,} bytes of {opt} state; an even flat "
                                  f"shard is {even:,} (1/{r.world_size} of {full:,}) "
                                  f"({_label(r)})")
    return Verdict(True)


def judge_zero_traffic(r: CaseResult) -> Verdict:
    values = judge_zero(r)
    if not values.passed:
        return values
    steps = r.case.get("steps", 3)
    want = {RS: steps, AG: steps}
    for rank, t in enumerate(r.traffic):
        calls = t.calls
        if calls.get("all_reduce"):
            return Verdict(False, f"rank {rank} called all_reduce {calls['all_reduce']} times: "
                                  "ZeRO-2 reduce-scatters the gradient (each rank needs only its "
                                  "shard's sum), then all-gathers the parameters")
        got = {op: calls.get(op, 0) for op in want}
        if got != want:
            return Verdict(False, f"rank {rank} made {_calls(got)} in {steps} steps; expected "
                                  f"one flat reduce-scatter and one all-gather per step, "
                                  f"{_calls(want)}")
    return Verdict(True)


# -- FSDPLinear ------------------------------------------------------------------------------

def _linears(model: nn.Module) -> list[nn.Linear]:
    return [m for m in model if isinstance(m, nn.Linear)]


def _flat(layer: nn.Linear) -> torch.Tensor:
    return torch.cat([layer.weight.detach().reshape(-1), layer.bias.detach().reshape(-1)])


def _assemble(outputs: list, key: str, unit: int, numel: int) -> torch.Tensor | None:
    try:
        return torch.cat([o[key][unit].double().reshape(-1) for o in outputs])[:numel]
    except (KeyError, IndexError, TypeError, RuntimeError):
        return None


def judge_fsdp(r: CaseResult) -> Verdict:
    p, steps = r.world_size, r.case.get("steps", 2)
    layers = _linears(make_model(r.case))
    for i, layer in enumerate(layers):  # the shards before training: offsets
        flat = _flat(layer).double()
        size = math.ceil(flat.numel() / p)
        padded = torch.cat([flat, flat.new_zeros(p * size - flat.numel())])
        chunks = [padded[k * size:(k + 1) * size] for k in range(p)]
        for rank, out in enumerate(r.outputs):
            got = out["init_shards"][i] if isinstance(out, dict) else None
            if not _close(got, chunks[rank]):
                other = next((k for k, c in enumerate(chunks) if _close(got, c)), None)
                said = f"chunk {other}'s elements" if other is not None else "other elements"
                return Verdict(False, f"before training, rank {rank}'s shard of layer {i} holds "
                                      f"{said}; it should hold [{rank}·S, {rank + 1}·S) of the "
                                      f"flat (weight, bias) vector, S = {size}: wrong shard "
                                      f"offsets ({_label(r)})")
    for scale in (1.0, p):
        model = reference(r.case, steps=steps, optimizer="plain_sgd", grad_scale=scale)
        wrong = None
        for i, layer in enumerate(_linears(model)):
            want = _flat(layer).double()
            got = _assemble(r.outputs, "shards", i, want.numel())
            if got is None or not _close(got, want):
                wrong = i
                break
        if wrong is None:
            if scale == 1.0:
                return Verdict(True)
            return Verdict(False, f"the trained parameters match gradients *summed* over the {p} "
                                  f"ranks ({_label(r)}): divide the reduce-scattered gradient by "
                                  "the world size")
        if scale == 1.0:
            first_wrong = wrong
    return Verdict(False, f"after {steps} SGD steps, layer {first_wrong}'s parameters (every "
                          f"rank's shard, put together) differ from single-process training "
                          f"({_label(r)}): check the three gradients in backward and which "
                          f"shard reduce_scatter_grads returns")


def judge_fsdp_traffic(r: CaseResult) -> Verdict:
    values = judge_fsdp(r)
    if not values.passed:
        return values
    steps, units = r.case.get("steps", 2), len(r.case["dims"]) - 1
    for rank, (out, t) in enumerate(zip(r.outputs, r.traffic)):
        held = out.get("held_after_forward")
        if held:
            return Verdict(False, f"rank {rank} still held {held:,} bytes of gathered parameters "
                                  "after forward: release them right after use (and save only x "
                                  "for backward, which gathers the weight again)")
        calls = t.calls
        if calls.get("all_reduce"):
            return Verdict(False, f"rank {rank} called all_reduce: FSDP reduce-scatters the "
                                  "gradient, so each rank receives only its shard's sum "
                                  "((N−1)/N·Ψ per rank instead of 2(N−1)/N·Ψ)")
        want = {AG: 2 * units * steps, RS: units * steps}
        got = {op: calls.get(op, 0) for op in want}
        if got != want:
            return Verdict(False, f"rank {rank} made {_calls(got)} for {units} units × {steps} "
                                  f"steps; expected an all-gather in forward and one in backward "
                                  f"and a reduce-scatter per unit and step: {_calls(want)}")
    return Verdict(True)


def judge_fsdp_state(r: CaseResult) -> Verdict:
    model = reference(r.case, steps=1, optimizer="plain_sgd")
    for rank, out in enumerate(r.outputs):
        for i, layer in enumerate(_linears(model)):
            got = out[i] if isinstance(out, list) and len(out) > i else None
            for name in ("weight", "bias"):
                value = got.get(name) if isinstance(got, dict) else None
                if not _close(value, getattr(layer, name).detach()):
                    return Verdict(False, f"rank {rank}: full_state_dict() of layer {i} gives a "
                                          f"{name} that differs from single-process training "
                                          f"after one step ({_label(r)})")
    return Verdict(True)


CHECKS = [
    Check("shard_bounds and flatten_padded: p equal shards of ⌈n/p⌉, zero padding", 6, "bounds",
          ({"world_size": 1, "sizes": [1, 7, 12, 13]},), judge_bounds,
          about="n = 1, 7, 12, 13 elements over p = 1-4 ranks (pure functions, one rank)."),
    Check("ShardedOptimizer (SGD + momentum): equals single-process training after 3 steps", 10,
          "zero", cases([(2, (7, 5, 3), ("0.bias",)), (3, (5, 4, 2), ())], optimizer="sgd"),
          judge_zero, about="Sizes p does not divide, a frozen bias; compared in float64."),
    Check("ShardedOptimizer (Adam): each rank holds ≈ 1/p of the optimizer state", 6, "zero",
          cases([(2, (7, 5, 3), ()), (4, (7, 5, 3), ())], seed=10, optimizer="adam"),
          judge_state, about="Bytes of exp_avg and exp_avg_sq measured on each rank."),
    Check("FSDPLinear: shards in place, training equals single-process after 2 steps", 10,
          "fsdp", cases([(2, (5, 6, 3), ()), (2, (3, 4, 4, 2), ())], seed=20), judge_fsdp,
          about="Every rank's shard before training, then all shards put together after SGD."),
    Check("FSDPLinear: 2 all-gathers + 1 reduce-scatter per unit, nothing held after forward",
          8, "fsdp", cases([(2, (5, 6, 3), ())], seed=30), judge_fsdp_traffic,
          about="Calls counted by the recorder; gathered bytes alive after the first forward."),
]
