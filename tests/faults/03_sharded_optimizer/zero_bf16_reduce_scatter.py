# Red-team pass 5 (fair03_zero_bf16_rs): a ZeRO-2 that reduce-scatters the gradient in bf16, as
# mixed-precision trainers do. The lab's spec is float32, so the values check refuses it; its
# message must name the precision, not the shard offsets (the values are right, rounded).
# ruff: noqa: F811, F821, E402 - a fragment appended to sharding.py


@torch.no_grad()
def _step_bf16(self):
    p = self.world_size
    grads = [q.grad if q.grad is not None else torch.zeros_like(q) for q in self.params]
    flat_grad = flatten_padded(grads, p).to(torch.bfloat16)
    mine = flat_grad.new_empty(flat_grad.numel() // p)
    dist.reduce_scatter_tensor(mine, flat_grad)
    self.shard.grad = mine.float() / p
    self.optimizer.step()
    full = torch.empty(flat_grad.numel(), dtype=self.shard.dtype, device=flat_grad.device)
    dist.all_gather_into_tensor(full, self.shard.detach())
    offset = 0
    for q in self.params:
        q.copy_(full[offset:offset + q.numel()].view_as(q))
        offset += q.numel()


ShardedOptimizer.step = _step_bf16
