"""Lab 06's expected values and the usual mistakes, for the judges in `checks.py`.

Everything comes from the course's one copy of each algorithm, `toolkit.precision`:
`next_scale` is the dynamic rule (`torch.amp.GradScaler`'s: backoff on inf/NaN, growth after N
good steps), `master_copy` / `copy_to_working` make the float64 reference's masters and the
bf16 rounding a working weight must equal. The training reference (`trajectory`) is plain SGD
in float64 on the same bf16-rounded start and inputs, on the mean of the ranks' losses (what
averaged gradients train), skipping the steps where an overflow was injected (on any rank) and
scaling with `next_scale`: mixed precision must follow it within `TOLERANCE`.

`local_gradients` is what rank r's scaled backward leaves in ``.grad`` at each step, before any
all-reduce: the gradient of its own mean squared error times the loss scale of that step, in
float64 at the reference's weights rounded to bf16 (the working weights a correct rank holds
then), on its own bf16 inputs. Every gradient all-reduce must carry it (`traffic.py`).

`step_ratio` measures how far a submission's first taken step went against the reference's
(a least-squares factor): 1/s means the gradients were unscaled twice, s that the step used
the scaled gradients, 0 that the masters never moved (Micikevicius et al., 2018, §3.1-3.2).
"""

from __future__ import annotations

import torch

from autograder.lab import CaseResult
from toolkit.precision import copy_to_working, master_copy, next_scale

TOLERANCE = 0.05
"""After every step, each master within 5 % of the distance the float64 reference has moved
from the start (max norm), plus 1e-6."""


def scales(case: dict, flags: list[bool]) -> list[float]:
    """The loss scale after each update of the dynamic rule, from ``init_scale``."""
    rule = {k: case[k] for k in ("growth_factor", "backoff_factor", "growth_interval")
            if k in case}
    scale, good, out = float(case["init_scale"]), 0, []
    for found in flags:
        scale, good = next_scale(scale, good, found, **rule)
        out.append(scale)
    return out


def rounded(values: list[torch.Tensor], dtype: torch.dtype = torch.bfloat16) -> list[torch.Tensor]:
    """`values` rounded into `dtype` working tensors (`toolkit.precision.copy_to_working`)."""
    working = [torch.empty(v.shape, dtype=dtype) for v in values]
    copy_to_working(values, working)
    return working


def skipped(case: dict) -> list[bool]:
    """Per step: was an overflow injected on some rank (so every rank must skip it)."""
    bad = {t for t, _ in case.get("overflow", [])}
    return [t in bad for t in range(case["steps"])]


def trajectory(r: CaseResult, *, grad_factor: float = 1.0) -> list[list[torch.Tensor]]:
    """The float64 reference's [weight, bias] after each step (`grad_factor` multiplies the
    gradient the step uses: the usual mistakes' trajectories)."""
    i0 = r.inputs[0]
    start = rounded([i0["w0"], i0["b0"]])  # the working weights the ranks begin with
    masters = master_copy(start, torch.float64)
    sgd = torch.optim.SGD(masters, lr=r.case["lr"])
    xs = [i["x"].to(torch.bfloat16).double() for i in r.inputs]  # the ranks' bf16 inputs
    ys = [i["y"].float().double() for i in r.inputs]
    out = []
    for t, skip in enumerate(skipped(r.case)):
        if not skip:
            sgd.zero_grad()
            w, b = masters
            loss = sum(((x[t] @ w.T + b - y[t]) ** 2).mean() for x, y in zip(xs, ys))
            (loss / len(xs) * grad_factor).backward()
            sgd.step()
        out.append([m.detach().clone() for m in masters])
    return out


def local_gradients(r: CaseResult, rank: int) -> list[list[torch.Tensor] | None]:
    """Per step t, rank `rank`'s scaled local gradients [weight, bias] (flat, float64) at the
    reference's weights before step t rounded to bf16, times the loss scale of step t; None
    where the case injects an overflow on this rank (its loss times inf: no finite gradient)."""
    c, i = r.case, r.inputs[rank]
    ref, skip = trajectory(r), skipped(r.case)
    scale = [float(c["init_scale"])] + scales(c, skip)
    overflow = {tuple(o) for o in c.get("overflow", [])}
    out = []
    for t in range(c["steps"]):
        if (t, rank) in overflow:
            out.append(None)
            continue
        w, b = [v.double().requires_grad_() for v in rounded(ref[t - 1] if t else start(r))]
        x, y = i["x"][t].to(torch.bfloat16).double(), i["y"][t].float().double()
        (((x @ w.T + b - y) ** 2).mean() * scale[t]).backward()
        out.append([w.grad.reshape(-1), b.grad.reshape(-1)])
    return out


def start(r: CaseResult) -> list[torch.Tensor]:
    return [t.double() for t in rounded([r.inputs[0]["w0"], r.inputs[0]["b0"]])]


def distance(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float((x.double() - y.double()).abs().max()) for x, y in zip(a, b))


def step_ratio(before: list[torch.Tensor], after: list[torch.Tensor],
               want_before: list[torch.Tensor], want_after: list[torch.Tensor]) -> float:
    """The factor k that best fits the submission's step as k times the reference's."""
    got = torch.cat([(a.double() - b.double()).reshape(-1) for a, b in zip(after, before)])
    want = torch.cat([(a - b).reshape(-1) for a, b in zip(want_after, want_before)])
    return float(got @ want / (want @ want))


def name_step(ratio: float, scale: float) -> str | None:
    """The usual mistake a step of `ratio` times the reference's means, or None."""
    if abs(ratio) < min(1e-3, 0.1 / scale):  # no movement, and not the 1/s of a double unscale
        return ("the masters did not move: the optimizer must step the fp32 masters, and "
                "copy_to_working round them into the working weights")
    if scale != 1 and abs(ratio * scale - 1) < 0.2:
        return (f"the step went 1/{scale:g} as far as the reference: the gradients were "
                f"unscaled twice (divided by the loss scale twice)")
    if scale != 1 and abs(ratio / scale - 1) < 0.2:
        return (f"the step went {scale:g}× as far as the reference: the optimizer stepped "
                f"with the scaled gradients (divide them by the loss scale first)")
    return None


__all__ = ["TOLERANCE", "distance", "local_gradients", "name_step", "rounded", "scales",
           "skipped", "start", "step_ratio", "trajectory"]
