"""Which dtype every op of a real run computes in, recorded from the dispatcher, not assumed.

`torch.autocast` (PyTorch docs, "Automatic Mixed Precision package", Autocast Op Reference)
sorts ops in three kinds, per device:

    lower precision   inputs cast to the autocast dtype (matmuls: linear, addmm, mm, bmm, ...)
    fp32              inputs cast up to fp32 (on CPU: the losses, e.g. cross_entropy, mse_loss)
    neither           computes in whatever dtype its inputs have (type promotion decides)

The lists differ between devices: on CUDA softmax, log_softmax and layer_norm are on the fp32
list; on CPU they are not, so there they run in 16 bits when their input is 16-bit. Rather than
trust a table, `record_op_dtypes` runs the model under a `TorchDispatchMode`, which sees every
aten op after autocast has cast its inputs, and records the op, the module it ran in, and the
dtypes in and out; `autocast_policy` tells the three kinds apart by calling one op twice (fp32
inputs, then 16-bit inputs) under autocast.

    rows = record_op_dtypes(model, lambda: model(x, y)[1], autocast=torch.bfloat16)
    autocast_policy(torch.softmax, dim=-1)      # 'input dtype' on CPU
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

SHAPE_OPS = frozenset({
    "view", "_unsafe_view", "t", "transpose", "expand", "clone", "detach", "as_strided",
    "select", "slice", "unsqueeze", "squeeze", "permute", "reshape", "alias", "split",
    "contiguous", "_reshape_alias", "unbind", "lift_fresh", "copy_", "empty_like", "zeros_like",
    "ones_like", "new_empty", "new_zeros", "fill_", "zero_", "ones", "zeros", "empty",
    "arange", "triu", "_to_copy", "to",
})
"""Ops that move or make data without computing on it; `record_op_dtypes` leaves them out
unless asked (``_to_copy`` is autocast's own cast)."""


@dataclass(frozen=True)
class OpRecord:
    """One aten op of a recorded run."""

    phase: str
    """"forward" or "backward"."""
    module: str
    """Qualified name of the innermost module running it ("" the model itself; in backward
    the module is not known: "")."""
    kind: str
    """That module's class name ("" in backward)."""
    op: str
    """The aten op without its overload, e.g. "addmm", "native_layer_norm"."""
    inputs: tuple[str, ...]
    """dtypes of its floating-point tensor inputs, e.g. ("bfloat16", "bfloat16")."""
    output: str
    """dtype of its first floating-point output ("" if none)."""


def _dtypes(tree: Any) -> tuple[str, ...]:
    return tuple(str(t.dtype).removeprefix("torch.") for t in tree_flatten(tree)[0]
                 if isinstance(t, Tensor) and t.is_floating_point())


class _Recorder(TorchDispatchMode):
    def __init__(self, keep_shape_ops: bool) -> None:
        super().__init__()
        self.keep, self.rows, self.phase, self.stack = keep_shape_ops, [], "forward", []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        out = func(*args, **(kwargs or {}))
        op = func.overloadpacket.__name__
        if self.keep or op not in SHAPE_OPS:
            module, kind = self.stack[-1] if self.stack else ("", "")
            outs = _dtypes(out)
            self.rows.append(OpRecord(self.phase, module, kind, op, _dtypes((args, kwargs)),
                                      outs[0] if outs else ""))
        return out


def record_op_dtypes(model: nn.Module, forward: Callable[[], Tensor], *,
                     autocast: torch.dtype | None = None, device_type: str | None = None,
                     backward: bool = True, keep_shape_ops: bool = False) -> list[OpRecord]:
    """Run ``forward()`` (it calls `model` and returns a scalar loss) under
    ``torch.autocast(device_type, dtype=autocast)`` (no autocast when None; `device_type`
    defaults to the model's parameters' device), then its backward when `backward`, and return
    every op that computed, in order, with the dtypes it saw (`OpRecord`). The model's
    gradients are cleared first (so a second call records the same backward, not an
    accumulation into the first one's gradients) and left set afterwards."""
    if device_type is None:
        device_type = next(model.parameters()).device.type
    rec = _Recorder(keep_shape_ops)
    names = {m: n for n, m in model.named_modules()}

    def push(m: nn.Module, *_: Any) -> None:
        rec.stack.append((names[m], type(m).__name__))

    def pop(m: nn.Module, *_: Any) -> None:
        rec.stack.pop()

    model.zero_grad(set_to_none=True)
    handles = [h for m in names for h in (m.register_forward_pre_hook(push),
                                          m.register_forward_hook(pop))]
    try:
        with rec, torch.autocast(device_type, dtype=autocast or torch.bfloat16,
                                 enabled=autocast is not None):
            loss = forward()
        if backward:
            rec.phase, rec.stack = "backward", []
            with rec:
                loss.backward()
    finally:
        for h in handles:
            h.remove()
    return rec.rows


def autocast_policy(op: Callable[..., Tensor], *args: Any, device_type: str = "cpu",
                    dtype: torch.dtype = torch.bfloat16, example: Tensor | None = None,
                    **kwargs: Any) -> str:
    """How autocast treats `op` on `device_type`: "lower precision" (fp32 inputs are cast down
    to `dtype`), "fp32" (`dtype` inputs are cast up), or "input dtype" (neither). `op` is
    called as ``op(x, *args, **kwargs)`` with `example` (default: a 4 × 8 tensor of ones on
    `device_type`) in fp32 and in `dtype`."""
    x = example if example is not None else torch.ones(4, 8, device=device_type)
    with torch.autocast(device_type, dtype=dtype):
        from_fp32 = op(x.float(), *args, **kwargs).dtype
        from_low = op(x.to(dtype), *args, **kwargs).dtype
    if from_fp32 == dtype:
        return "lower precision"
    if from_low == torch.float32:
        return "fp32"
    return "input dtype"


__all__ = ["OpRecord", "SHAPE_OPS", "autocast_policy", "record_op_dtypes"]
