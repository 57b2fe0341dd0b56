"""An offloaded optimizer's state dict, in torch's own format, so that a checkpoint of
`OffloadOptimizer` loads into the in-memory optimizer it wraps and back.

torch.optim's state dict (`torch.optim.Optimizer.state_dict`) numbers the parameters in order of
first appearance across the param groups: ``{"state": {i: {name: value}}, "param_groups":
[{**options, "params": [i, ...]}]}``. The offloaded optimizer keeps each parameter's tensor
states as slices of the store's flat tensors, one slice per chunk, and its scalar states (Adam's
``step``) per chunk on the device; `pack` reads every slice back into a whole tensor shaped like
the parameter, `unpack` writes them out again. The traffic counts in the store's totals, never in
a step's (`StepStats` are deltas inside `step`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

if TYPE_CHECKING:
    from .optimizer import OffloadOptimizer


def group_options(group: dict[str, Any]) -> dict[str, Any]:
    """A param group's options (everything but its parameters)."""
    return {k: v for k, v in group.items() if k != "params"}


def is_tensor_state(name: str, value: Any, param: Tensor) -> bool:
    """A state shaped like its parameter (it goes to the store), not a scalar like Adam's step
    (kept on the device; "step" by name too, for 0-dim parameters)."""
    return isinstance(value, Tensor) and value.shape == param.shape and name != "step"


def _indexed(opt: OffloadOptimizer) -> list[nn.Parameter]:
    """Parameters in torch's state-dict numbering (first appearance across groups)."""
    seen: dict[int, nn.Parameter] = {}
    for group in opt.param_groups:
        for p in group["params"]:
            seen.setdefault(id(p), p)
    return list(seen.values())


def _by_param(opt: OffloadOptimizer) -> dict[int, list[Any]]:
    out: dict[int, list[Any]] = {}
    for c in opt.chunks:
        out.setdefault(id(c.param), []).append(c)
    return out


def _copy(value: Any) -> Any:
    return value.clone() if isinstance(value, Tensor) else value


def pack(opt: OffloadOptimizer) -> dict[str, Any]:
    """The state dict of `opt`, every tensor state read whole from its store (plus "master"
    with master weights), on the parameter's device."""
    params = _indexed(opt)
    index = {id(p): i for i, p in enumerate(params)}
    groups = [{**group_options(g), "params": [index[id(p)] for p in g["params"]]}
              for g in opt.param_groups]
    state = {}
    for chunks in _by_param(opt).values():
        if not all(c.started for c in chunks):
            continue
        p = chunks[0].param
        entry = {n: _copy(v) for n, v in chunks[0].resident.items()}
        for name, dtype in opt.layout.items():
            whole = torch.empty(p.numel(), dtype=dtype, device=p.device)
            for c in chunks:
                opt.store.read(name, c.offset, c.offset + c.numel, whole[c.lo:c.hi])
            entry[name] = whole.view_as(p)
        if entry:  # as torch: a parameter whose optimizer keeps no state has no entry
            state[index[id(p)]] = entry
    return {"state": state, "param_groups": groups}


def unpack(opt: OffloadOptimizer, state_dict: dict[str, Any]) -> None:
    """Load `state_dict` (from `pack`, or from the wrapped torch optimizer on the same
    parameters and groups) into `opt`'s store, chunk residents and group options."""
    saved = state_dict["param_groups"]
    if [len(g["params"]) for g in saved] != [len(g["params"]) for g in opt.param_groups]:
        raise ValueError("OffloadOptimizer.load_state_dict: the saved param groups do not match "
                         "this optimizer's (load onto the same parameters in the same groups)")
    for group, options in zip(opt.param_groups, saved):
        group.update(group_options(options))
    params, chunks = _indexed(opt), _by_param(opt)
    for i, entry in state_dict["state"].items():
        p = params[int(i)]
        for c in chunks.get(id(p), []):
            c.resident = {n: _copy(v) for n, v in entry.items() if not is_tensor_state(n, v, p)}
            for name, value in entry.items():
                if is_tensor_state(name, value, p):
                    opt.layout.setdefault(name, value.dtype)
                    opt.store.allocate(name, opt.numel, value.dtype)
                    opt.store.write(name, c.offset, c.offset + c.numel,
                                    value.reshape(-1)[c.lo:c.hi])
            c.started = True


__all__ = ["group_options", "is_tensor_state", "pack", "unpack"]
