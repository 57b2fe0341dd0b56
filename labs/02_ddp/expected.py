"""Lab 02's reference: single-process training and the gradients each all-reduce must carry,
in float64, for a case.

DDP applies the *mean* of the ranks' gradients (Li et al., "PyTorch Distributed", VLDB 2020,
§2: rank r's loss is the mean over its equal slice of the batch, so the full-batch gradient is
the mean of the p ranks'). `reference` trains rank 0's initial model on the whole batch, with
the gates the ranks were answered; `local_gradients` is what rank r's backward leaves in
``.grad`` in one step, at the weights that step started from: the sum over its k micro-batches
of ∇(loss_j / k), micro-batch j's first-layer gradient scaled by s_{t·k+j} (`harness.Gate`).
That is what its buckets carry into the all-reduce (or that over p: dividing first is fine).
Buckets are the course's rule (`toolkit.data_parallel.buckets.assign_buckets`, trusted code run
here, never in the ranks). Loaded by path from checks.py and traffic.py, as the grader loads
every lab file; the harness is the lab's harness.py under the name the ranks use.
"""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F

from _lab_harness import LR, install_gate, make_model, micro_batches, uses_side  # harness.py
from autograder.sandbox.gate import LOCAL_KEY, scale
from toolkit.data_parallel.buckets import assign_buckets

DEFAULT_CAP = 25 * 2**20  # bytes: DDP's default bucket_cap_mb = 25


def trainable(case: dict) -> list[torch.nn.Parameter]:
    """The case's trainable parameters, in ``model.parameters()`` order (a tied weight once)."""
    return [p for p in make_model(case, 0).parameters() if p.requires_grad]


def expected_buckets(case: dict) -> list[list[int]]:
    """Indices into `trainable` of each bucket, in launch order (reverse parameter order)."""
    return assign_buckets(trainable(case), int(case.get("cap", DEFAULT_CAP)))


def bucket_bytes(case: dict) -> list[int]:
    """Bytes of each bucket of the case's model, in bucket order."""
    params = trainable(case)
    return [sum(params[i].numel() * params[i].element_size() for i in b)
            for b in expected_buckets(case)]


def _scales(case: dict):
    """s_0, s_1, ...: the answers to a rank's gates in the case (every rank's n-th alike)."""
    key, asked = case.get("gate_key") or LOCAL_KEY, itertools.count()
    return lambda: scale(key, next(asked))


def reference(case: dict, *, grad_scale: float = 1.0) -> dict[str, torch.Tensor]:
    """Rank 0's initial model trained in one process, float64, on the whole batch, with the
    gates the ranks were answered: micro-batch j of step t (every rank's j-th, together) passes
    its first layer's gradient through s_{t·k + j}. The whole batch's mean loss is the mean of
    the k micro-batches' (equal sizes), so this is what DDP with no_sync() must reach. A
    `grad_scale` of world_size gives what a run that *sums* gradients over ranks reaches."""
    model = make_model(case, 0).double()
    p, k = int(case.get("world_size", 1)), int(case.get("accumulate", 1))
    per_rank = [micro_batches(case, r, p) for r in range(p)]
    parts = [[torch.cat([mb[j][i] for mb in per_rank]).double() for i in (0, 1)]
             for j in range(k)]  # micro-batch j of every rank: (x, y)
    install_gate(model, _scales(case))
    params = [q for q in model.parameters() if q.requires_grad]
    for step in range(int(case.get("steps", 3))):
        for q in params:
            q.grad = None
        use = {"use_side": True} if uses_side(case, step) else {}
        for x, y in parts:
            (grad_scale * F.mse_loss(model(x, **use), y) / k).backward()
        with torch.no_grad():
            for q in params:
                if q.grad is not None:
                    q.add_(q.grad, alpha=-LR)
    return {name: v.detach() for name, v in model.state_dict().items()}


def local_gradients(case: dict, states: list[dict], rank: int) -> list[list[torch.Tensor]]:
    """Per step t, rank `rank`'s gradient of each trainable parameter (flat, float64; zeros
    where it got none, as `finish` packs them) at ``states[t]``, the weights the rank says step
    t started from: what its all-reduces of step t carry. The gate scales follow the schedule
    (micro-batch j of step t: s_{t·k+j}), as the courier answered a rank that asks once per
    backward."""
    p, k = int(case["world_size"]), int(case.get("accumulate", 1))
    batches = [(x.double(), y.double()) for x, y in micro_batches(case, rank, p)]
    ask = _scales(case)
    out = []
    for step, state in enumerate(states):
        model = make_model(case, 0).double()
        model.load_state_dict({n: v.double() for n, v in state.items()})
        install_gate(model, ask)
        use = {"use_side": True} if uses_side(case, step) else {}
        for x, y in batches:
            (F.mse_loss(model(x, **use), y) / k).backward()
        out.append([(q.grad if q.grad is not None else torch.zeros_like(q)).reshape(-1)
                    for q in model.parameters() if q.requires_grad])
    return out


__all__ = ["DEFAULT_CAP", "bucket_bytes", "expected_buckets", "local_gradients", "reference",
           "trainable"]
