# Red-team pass 4 (lab03_allgather_grads): ZeRO that is not sharded, with traffic of the right
# calls and shapes. One reduce-scatter of the flat padded gradient (p·S in, S out) and one
# all-gather of S elements per step, but the all-gather carries the *summed gradient* shard,
# not the updated parameters: every rank gets the whole gradient and steps the whole model
# with a full optimizer hidden in a list (`self.optimizer` is a decoy on the shard). The
# courier keeps every collective's input; the checks compare it with the grader's own step:
# the state check and the traffic check fail on the all-gather's contents; the values stay
# right.
# ruff: noqa: F811, F821 - a fragment appended to sharding.py

class ShardedOptimizer:  # noqa: F811
    def __init__(self, params, optimizer_class, **defaults):
        self.params = [p for p in params if p.requires_grad]
        self.world_size, self.rank = dist.get_world_size(), dist.get_rank()
        self.numel = sum(p.numel() for p in self.params)
        flat = flatten_padded([p.detach() for p in self.params], self.world_size)
        self.start, self.end = shard_bounds(self.numel, self.world_size, self.rank)
        self.shard = nn.Parameter(flat[self.start:self.end].clone())
        self.optimizer = optimizer_class([self.shard], **defaults)   # decoy, measured
        self._full = [optimizer_class(self.params, **defaults)]     # the real one, hidden

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self):
        p = self.world_size
        grads = [q.grad if q.grad is not None else torch.zeros_like(q) for q in self.params]
        flat = flatten_padded(grads, p)
        mine = torch.empty(flat.numel() // p, dtype=flat.dtype, device=flat.device)
        dist.reduce_scatter_tensor(mine, flat)              # p·S in, S out
        total = torch.empty_like(flat)
        dist.all_gather_into_tensor(total, mine)            # S in: the gradient, not parameters
        mean = total / p
        off = 0
        for q in self.params:
            q.grad = mean[off:off + q.numel()].view_as(q).clone()
            off += q.numel()
        self._full[0].step()                                # full replicated update
        self.shard.grad = mean[self.start:self.end].clone()
        self.optimizer.step()                               # decoy keeps 1/p state
