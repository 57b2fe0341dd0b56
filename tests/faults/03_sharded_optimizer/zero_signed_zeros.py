# Red-team pass 6 (lab03_zero_signed_zeros): pass 5's hidden full replica trained on the whole
# batch, the batch carried by constructor broadcasts as +0.0/−0.0 sign bits (the padding rule
# treated −0.0 as zero). Padding must now be +0.0 and the broadcasts together at most one copy
# of the parameters: the state check fails; values pass.
# ruff: noqa: F811, F821, E402 - a fragment appended to sharding.py


# -- red team 5: replicated (unsharded) training behind correct-looking ZeRO traffic -----------
# Broadcasts are allowed before the first reduce-scatter/all-gather ("in a constructor") and
# their contents are not judged. The constructor reads its own slice of the batch from the
# caller's frame (reading, not patching, the harness) and broadcasts every rank's slice: each
# rank then holds the WHOLE batch, computes the whole mean gradient itself every step and steps
# a full optimizer hidden in a list. The reduce-scatter still takes the local flat gradient and
# the all-gather the rank's shard of the updated parameters (both correct, so the contents check
# passes), but their outputs are thrown away: the model is copied from the hidden replica.
import sys as _sys  # noqa: E402
import torch.nn.functional as _F  # noqa: E402

_orig_init = ShardedOptimizer.__init__
_BITS = None


def _enc(t):
    """float32 -> one float32 per bit: +0.0 for 0, -0.0 for 1."""
    bits = t.contiguous().view(torch.int32).reshape(-1, 1)
    shifts = torch.arange(32, dtype=torch.int32, device=t.device)
    b = ((bits >> shifts) & 1).reshape(-1)
    return torch.where(b.bool(), torch.tensor(-0.0, device=t.device),
                       torch.tensor(0.0, device=t.device))


def _dec(z, shape):
    b = torch.signbit(z).to(torch.int64).reshape(-1, 32)
    w = (b << torch.arange(32, device=z.device)).sum(1)
    w = torch.where(w >= 2 ** 31, w - 2 ** 32, w).to(torch.int32)
    return w.view(torch.float32).reshape(shape)


def _init_replicated(self, params, optimizer_class, **defaults):
    params = list(params)
    _orig_init(self, params, optimizer_class, **defaults)   # self.optimizer: the decoy shard
    caller = _sys._getframe(1).f_locals
    call, self._model = caller["call"], caller["model"]
    x, y = (t.to(call.device) for t in call.inputs["batch"])
    xs, ys = [], []
    for src in range(self.world_size):                     # p broadcasts, all before training
        # red team 6: every element sent is +0.0 or -0.0 (nonzero() sees none, so the
        # "run of initial parameters" rule has nothing to judge); the sign bits carry x and y
        bx = _enc(x) if src == self.rank else torch.empty(x.numel() * 32, device=x.device)
        by = _enc(y) if src == self.rank else torch.empty(y.numel() * 32, device=y.device)
        dist.broadcast(bx, src=src)
        dist.broadcast(by, src=src)
        xs.append(_dec(bx, x.shape))
        ys.append(_dec(by, y.shape))
    self._X, self._Y = torch.cat(xs), torch.cat(ys)         # the WHOLE batch on every rank
    self._replica = [q.detach().clone().requires_grad_(True) for q in self.params]
    self._hidden = [optimizer_class(self._replica, **defaults)]  # full state, not measured


@torch.no_grad()
def _step_replicated(self):
    p, r = self.world_size, self.rank
    local = flatten_padded([q.grad if q.grad is not None else torch.zeros_like(q)
                            for q in self.params], p)
    mine = local.new_empty(local.numel() // p)
    dist.reduce_scatter_tensor(mine, local)                # right contents, output used only
    self.shard.grad = mine / p                             # by the decoy optimizer (its state)
    self.optimizer.step()
    with torch.enable_grad():                              # the whole batch's mean gradient
        grads = torch.autograd.grad(_F.mse_loss(self._model(self._X), self._Y), self.params)
    for q, g in zip(self._replica, grads):
        q.grad = g
    self._hidden[0].step()                                 # replicated full optimizer
    new = flatten_padded([q.detach() for q in self._replica], p)
    s = new.numel() // p
    full = torch.empty_like(new)
    dist.all_gather_into_tensor(full, new[r * s:(r + 1) * s].clone())  # right contents, ignored
    for q, src in zip(self.params, self._replica):
        q.copy_(src)                                       # the model comes from the replica


ShardedOptimizer.__init__ = _init_replicated
ShardedOptimizer.step = _step_replicated
