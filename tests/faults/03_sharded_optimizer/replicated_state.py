# Red-team pass 3 (lab03_replicated_state): ZeRO-2 that is not sharded. Every rank keeps the
# whole optimizer state (in a list attribute the harness does not measure) and steps every
# parameter; the gradient sum comes from one reduce-scatter of the p-times repeated flat
# gradient (p·P elements in, P out), and `self.optimizer` is a decoy on the shard. The courier
# records each reduce-scatter's input: p·(p·S) where the case's model needs p·S, so the state
# check and the traffic check fail; the values stay right.
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
        self._full = [optimizer_class(self.params, **defaults)]     # the real one, hidden in a list

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self):
        p = self.world_size
        grads = [q.grad if q.grad is not None else torch.zeros_like(q) for q in self.params]
        flat = flatten_padded(grads, p)
        total = torch.empty_like(flat)
        dist.reduce_scatter_tensor(total, flat.repeat(p))   # everyone gets the whole sum
        mean = total / p
        off = 0
        for q in self.params:
            q.grad = mean[off:off + q.numel()].view_as(q).clone()
            off += q.numel()
        self._full[0].step()                                 # full replicated update
        self.shard.grad = mean[self.start:self.end].clone()
        self.optimizer.step()                                # decoy keeps 1/p state
        junk = torch.empty_like(flat)
        dist.all_gather_into_tensor(junk, self.shard.detach())  # decoy, result unused
