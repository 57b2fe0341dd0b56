# Fairness (red-team pass 6, fair03_zero_reversed_flat_bcast): a correct ZeRO-2 that syncs the
# initial parameters with one broadcast of its flat padded vector (of the trainable parameters,
# in the order its all-gathers use). Initial parameter values in any block order: full marks.
# ruff: noqa: F811, F821, E402 - a fragment appended to sharding.py


# pass 5) and syncs the initial parameters in __init__ with ONE broadcast of its flat padded
# vector from rank 0 (one collective instead of one per tensor), then copies it back. It sends
# nothing but initial parameter values, in the order its all-gathers use.
_orig_init = ShardedOptimizer.__init__


def _init_rev_bcast(self, params, optimizer_class, **defaults):
    params = [p for p in params if p.requires_grad][::-1]
    with torch.no_grad():
        flat = flatten_padded([p.detach() for p in params], dist.get_world_size())
        dist.broadcast(flat, src=0)
        offset = 0
        for q in params:
            q.copy_(flat[offset:offset + q.numel()].view_as(q))
            offset += q.numel()
    _orig_init(self, params, optimizer_class, **defaults)


ShardedOptimizer.__init__ = _init_rev_bcast
