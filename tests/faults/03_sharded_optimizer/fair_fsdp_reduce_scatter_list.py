# Not a fault: a correct FSDP reduce-scatter written with dist.reduce_scatter, the list form
# (p chunks of S elements in, S out), averaging before it. The courier keeps the inputs end to
# end, so what it carried is the rank's flat padded gradient over p: judged on contents since
# issue 30, every FSDP check passes.
# ruff: noqa: F821 - a fragment appended to sharding.py


def _reduce_scatter_list(self, weight_grad, bias_grad):
    flat = flatten_padded([weight_grad, bias_grad], self.world_size) / self.world_size
    mine = torch.empty_like(self.shard)
    dist.reduce_scatter(mine, list(flat.chunk(self.world_size)))
    return mine


FSDPLinear.reduce_scatter_grads = _reduce_scatter_list
