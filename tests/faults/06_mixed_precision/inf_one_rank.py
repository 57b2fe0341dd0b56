"""Mistake: the inf/NaN flag is not all-reduced, so each rank decides on its own gradients.
Expected: wrong_result on the unscale check, "checking inf on one rank only".
"""


@torch.no_grad()
def _unscale_alone(self, params, masters):
    found = False
    for p, m in zip(params, masters):
        if p.grad is None:
            m.grad = None
            continue
        m.grad = p.grad.float() / self.scale
        found = found or not bool(torch.isfinite(m.grad).all())
    return found


LossScaler.unscale_ = _unscale_alone
