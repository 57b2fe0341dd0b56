# Fairness (red-team pass 5, fair03_zero_reversed): a correct ZeRO-2 that flattens the
# parameters in reverse order (as gradients become ready in backward). The contents are judged
# in the order its all-gathers show: full marks.
# ruff: noqa: F811, F821, E402 - a fragment appended to sharding.py


# (as gradients become ready in backward: DeepSpeed's and torch DDP's buckets fill from the last
# layer). Same flat padded layout, same sizes, every rank steps only its S elements.
_orig_init = ShardedOptimizer.__init__


def _init_reversed(self, params, optimizer_class, **defaults):
    params = [p for p in params if p.requires_grad][::-1]
    _orig_init(self, params, optimizer_class, **defaults)


ShardedOptimizer.__init__ = _init_reversed
