# Fairness (red-team pass 5, fair03_zero_master64): a correct ZeRO-2 whose inner optimizer
# steps a float64 master shard; the all-gather carries float64. Optimizer state is counted in
# elements, not bytes: full marks.
# ruff: noqa: F811, F821, E402 - a fragment appended to sharding.py


# steps a float64 copy of the shard; the all-gather carries that float64 shard.
_orig_init = ShardedOptimizer.__init__


def _init64(self, params, optimizer_class, **defaults):
    _orig_init(self, params, optimizer_class, **defaults)
    self.shard = nn.Parameter(self.shard.detach().double())
    self.optimizer = optimizer_class([self.shard], **defaults)


@torch.no_grad()
def _step64(self):
    p = self.world_size
    grads = [q.grad if q.grad is not None else torch.zeros_like(q) for q in self.params]
    flat_grad = flatten_padded(grads, p)
    mine = flat_grad.new_empty(flat_grad.numel() // p)
    dist.reduce_scatter_tensor(mine, flat_grad)
    self.shard.grad = mine.double() / p
    self.optimizer.step()
    full = torch.empty(flat_grad.numel(), dtype=torch.float64, device=flat_grad.device)
    dist.all_gather_into_tensor(full, self.shard.detach())
    offset = 0
    for q in self.params:
        q.copy_(full[offset:offset + q.numel()].view_as(q))
        offset += q.numel()


ShardedOptimizer.__init__ = _init64
ShardedOptimizer.step = _step64
