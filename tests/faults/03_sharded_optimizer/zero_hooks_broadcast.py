# Red-team pass 5 (lab03_zero_hooks_broadcast): replicated training behind correct ZeRO traffic.
# __init__ hooks the model's forward to catch x and recovers y from MSE's gradient; in step 1,
# before the first reduce-scatter, every rank broadcasts its (x, y), so all hold the whole batch
# and train a hidden full replica while the counted collectives carry the right contents. A
# broadcast may now carry only initial parameter values: the state check fails; values pass.
# ruff: noqa: F811, F821, E402 - a fragment appended to sharding.py


# Like lab03_zero_batch_broadcast, but the rank finds its batch by itself: __init__ finds the
# model that owns its parameters (gc), hooks its forward (x, output) and the output's gradient
# (MSE: dL/dout = 2(out − y)/numel, so y = out − dL/dout·numel/2). In step 1, BEFORE the first
# reduce-scatter (broadcasts there are not "late"), every rank broadcasts its (x, y): all ranks
# then hold the whole batch and train a full hidden replica; the counted collectives carry the
# right contents and their outputs are thrown away.
import gc as _gc  # noqa: E402
import torch.nn.functional as _F  # noqa: E402

_orig_init = ShardedOptimizer.__init__


def _init_hooks(self, params, optimizer_class, **defaults):
    params = list(params)
    _orig_init(self, params, optimizer_class, **defaults)   # decoy self.optimizer on the shard
    first = self.params[0]
    self._model = next(o for o in _gc.get_objects() if isinstance(o, nn.Sequential)
                       and any(q is first for q in o.parameters()))
    self._seen = {}

    def grab(module, inputs, out):
        if "x" in self._seen or not out.requires_grad:
            return
        self._seen["x"], self._seen["out"] = inputs[0].detach().clone(), out.detach().clone()
        out.register_hook(lambda g: self._seen.setdefault("g", g.detach().clone()))

    self._hook = self._model.register_forward_hook(grab)
    self._replica = [q.detach().clone().requires_grad_(True) for q in self.params]
    self._hidden = [optimizer_class(self._replica, **defaults)]
    self._X = None


@torch.no_grad()
def _step_hooks(self):
    p, r = self.world_size, self.rank
    if self._X is None:                                    # step 1, before any counted call
        self._hook.remove()
        x, out, g = self._seen["x"], self._seen["out"], self._seen["g"]
        y = out - g * (out.numel() / 2)                    # MSE's target, from its gradient
        xs, ys = [], []
        for src in range(p):
            bx = x.clone() if src == r else torch.empty_like(x)
            by = y.clone() if src == r else torch.empty_like(y)
            dist.broadcast(bx, src=src)
            dist.broadcast(by, src=src)
            xs.append(bx)
            ys.append(by)
        self._X, self._Y = torch.cat(xs), torch.cat(ys)    # the whole batch, on every rank
    local = flatten_padded([q.grad if q.grad is not None else torch.zeros_like(q)
                            for q in self.params], p)
    mine = local.new_empty(local.numel() // p)
    dist.reduce_scatter_tensor(mine, local)                # right contents
    self.shard.grad = mine / p
    self.optimizer.step()                                  # the decoy's state: one shard
    with torch.enable_grad():
        grads = torch.autograd.grad(_F.mse_loss(self._model(self._X), self._Y), self.params)
    for q, gq in zip(self._replica, grads):
        q.grad = gq
    self._hidden[0].step()                                 # full optimizer, replicated
    new = flatten_padded([q.detach() for q in self._replica], p)
    s = new.numel() // p
    full = torch.empty_like(new)
    dist.all_gather_into_tensor(full, new[r * s:(r + 1) * s].clone())  # right contents, ignored
    for q, src in zip(self.params, self._replica):
        q.copy_(src)


ShardedOptimizer.__init__ = _init_hooks
ShardedOptimizer.step = _step_hooks
