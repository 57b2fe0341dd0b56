# Issue 30, the kernel's thread-exit wake (docs/grading.md, "What it does not stop"): an FSDP
# whose reduce-scatters carry zeros of the right size (p·S in, S out: their sizes were all that
# was judged) while each rank's gradient shard arrives by a channel outside the courier. No
# copy a rank holds can stand in for that channel (it has only its own slice of the batch, and
# the shard is a sum over every rank's), so "elsewhere" is emulated by a second, real
# reduce-scatter after the decoy: the point is what the courier saw where a unit's gradient
# was due, zeros. The values stay right; every FSDP check fails on the decoy's contents.
# ruff: noqa: F821 - a fragment appended to sharding.py, which defines these names


def _zeros_then_elsewhere(self, weight_grad, bias_grad):
    flat = flatten_padded([weight_grad, bias_grad], self.world_size)
    decoy = flat.new_empty(self.shard.numel())
    dist.reduce_scatter_tensor(decoy, torch.zeros_like(flat))  # what the courier is shown
    mine = flat.new_empty(self.shard.numel())
    dist.reduce_scatter_tensor(mine, flat)  # stands in for the channel outside the courier
    return mine / self.world_size


FSDPLinear.reduce_scatter_grads = _zeros_then_elsewhere
