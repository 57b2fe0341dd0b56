# Seventh red team (issue 30): no sharding at all, 74/100 on values alone. ShardedOptimizer is a
# plain data-parallel step (one all-reduce of the whole flat gradient, a full optimizer kept
# in a list, self.optimizer a decoy over the shard); FSDP's "all-gather" is an all-reduce of a
# zero buffer holding the rank's shard in its slot, its "reduce-scatter" an all-reduce of the
# whole gradient. The values are right; the checks now establish sharding from what the
# courier moved and kept (no all-reduce, reduce-scatters of p·S, all-gathers of one shard of
# the parameters), the values checks included.
# ruff: noqa: F821 - a fragment appended to sharding.py, which defines these names
_init = ShardedOptimizer.__init__


def _replicated_init(self, params, optimizer_class, **defaults):
    _init(self, params, optimizer_class, **defaults)
    self._full = [optimizer_class(self.params, **defaults)]  # the whole model's state


@torch.no_grad()
def _all_reduce_step(self):
    p = self.world_size
    grads = [q.grad if q.grad is not None else torch.zeros_like(q) for q in self.params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    offset = 0
    for q in self.params:
        q.grad = flat[offset:offset + q.numel()].view_as(q) / p
        offset += q.numel()
    self._full[0].step()
    self.shard.grad = torch.zeros_like(self.shard)
    self.optimizer.step()  # the decoy holds state of the shard's size


def _gather_by_all_reduce(self):
    s = self.shard.numel()
    self.full = self.shard.new_zeros(self.world_size * s)
    self.full[self.rank * s:(self.rank + 1) * s] = self.shard.detach()
    dist.all_reduce(self.full)
    n_weight = self.out_features * self.in_features
    return (self.full[:n_weight].view(self.out_features, self.in_features),
            self.full[n_weight:n_weight + self.out_features])


def _reduce_by_all_reduce(self, weight_grad, bias_grad):
    flat = flatten_padded([weight_grad, bias_grad], self.world_size)
    dist.all_reduce(flat)
    s = self.shard.numel()
    return flat[self.rank * s:(self.rank + 1) * s] / self.world_size


ShardedOptimizer.__init__ = _replicated_init
ShardedOptimizer.step = _all_reduce_step
FSDPLinear.gather_params = _gather_by_all_reduce
FSDPLinear.reduce_scatter_grads = _reduce_by_all_reduce
