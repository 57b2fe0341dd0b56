# Red-team pass 3 follow-up (issue 19): forged section marks. The harness's `Call` is found in
# the caller's frame; the MLP's forward closes the forward section, all-reduces its whole hidden
# activation (d_ff/p per rank, an extra exchange the MLP must not make), and reopens the
# section. The per-section count stays at one each way; the whole case, whose bounds are the
# courier's, holds three all-reduces.
import sys as _sys


def _harness_call():
    f = _sys._getframe(1)
    while f is not None:
        call = f.f_locals.get("call")
        if call is not None and hasattr(call, "mark"):
            return call
        f = f.f_back
    raise RuntimeError("no harness call found")


class ParallelMLP(ParallelMLP):  # noqa: F811
    def forward(self, x):
        call = _harness_call()
        hidden = F.gelu(self.up_proj(x))
        call.mark("layer.fwd:end")  # out of the counted section
        dist.all_reduce(hidden.detach().clone())
        call.mark("layer.fwd:begin")  # back in
        return self.down_proj(hidden)
