"""Mistake: unscale_ copies the gradients into fp32 without dividing by the scale, so the
optimizer steps with scaled gradients. Expected: wrong_result on the unscale check, "scaled
gradient".
"""


@torch.no_grad()
def _unscale_forgets_scale(self, params, masters):
    found = torch.zeros(1)
    for p, m in zip(params, masters):
        if p.grad is None:
            m.grad = None
            continue
        m.grad = p.grad.float()
        found = torch.maximum(found, (~torch.isfinite(m.grad)).any().float().reshape(1))
    dist.all_reduce(found, op=dist.ReduceOp.MAX)
    return bool(found.item() > 0)


LossScaler.unscale_ = _unscale_forgets_scale
