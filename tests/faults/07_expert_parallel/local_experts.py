# Red-team pass 3 (issue 19), lab07_local_experts: every rank runs EVERY expert on its own
# tokens; half the messages are zeros of the right size. It expects every rank's inputs to hold
# all E experts' weights (the harness's `w`, read from the caller's frame); since the fix a
# rank holds only its own experts', so the lookup of another rank's expert fails (IndexError in
# combine). Forward: the counts and the rows go to the experts' ranks for real (their weight
# gradients need them), but the experts' outputs come back as ZEROS; y is computed locally.
# Backward: dy goes to the experts' ranks
# for real, the rows' gradients come back as ZEROS; x's gradient is computed locally.
import sys as _sys
import torch.nn.functional as F

_dispatch_ref = dispatch  # the reference's, which the cheat wraps


class _ZerosForward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, send, in_splits, out_splits, group):
        ctx.args = (in_splits, out_splits, group)
        return all_to_all(torch.zeros_like(send), in_splits, out_splits, group)

    @staticmethod
    def backward(ctx, grad):
        in_splits, out_splits, group = ctx.args
        return all_to_all(grad, out_splits, in_splits, group), None, None, None


class _ZerosBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, send, in_splits, out_splits, group):
        ctx.args = (in_splits, out_splits, group)
        return all_to_all(send, in_splits, out_splits, group)

    @staticmethod
    def backward(ctx, grad):
        in_splits, out_splits, group = ctx.args
        return all_to_all(torch.zeros_like(grad), out_splits, in_splits, group), None, None, None


_real_exchange = Exchange


def dispatch(x, expert, kept, *, num_experts, group=None):  # noqa: F811
    global Exchange
    Exchange = _ZerosBackward
    try:
        out = _dispatch_ref(x, expert, kept, num_experts=num_experts, group=group)
    finally:
        Exchange = _real_exchange
    out.state.update(x=x, expert=expert, kept=kept)
    return out


def combine(expert_out, gate, dispatched):  # noqa: F811
    s = dispatched.state
    w = _sys._getframe(1).f_locals["w"]        # this rank's own inputs: all E experts
    back = torch.empty_like(s["order"])
    back[s["order"]] = torch.arange(s["order"].numel(), device=expert_out.device)
    zeros = _ZerosForward.apply(expert_out[back], s["out_splits"], s["in_splits"], s["group"])
    carrier = zeros * gate[s["token"], s["choice"]].detach().unsqueeze(1).to(zeros.dtype)
    y = zeros.new_zeros(s["tokens"], zeros.shape[1]).index_add(0, s["token"], carrier)  # = 0
    x, expert = s["x"], s["expert"]
    token, choice = s["kept"].nonzero(as_tuple=True)
    for t, j in zip(token.tolist(), choice.tolist()):
        e = int(expert[t, j])
        h = F.gelu(x[t] @ w["w1"][e].detach() + w["b1"][e].detach())
        out = h @ w["w2"][e].detach() + w["b2"][e].detach()
        y = y.index_add(0, torch.tensor([t], device=x.device), (gate[t, j] * out).unsqueeze(0))
    return y
