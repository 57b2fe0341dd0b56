# Red-team pass 3 (lab03_fsdp_keep_full): FSDP that keeps the gathered flat parameters alive
# from forward to backward as a plain ctx attribute (not saved with save_for_backward, not at
# unit.full) and makes a decoy all-gather in backward so the count stays right. The harness
# now walks every live tensor after the first forward (gc) for one that holds a unit's full
# weight: the traffic-and-release check fails; the values stay right.
# ruff: noqa: F811, F821 - a fragment appended to sharding.py

class GatheredLinear(torch.autograd.Function):  # noqa: F811
    @staticmethod
    def forward(ctx, x, shard, unit):
        ctx.unit = unit
        weight, bias = unit.gather_params()
        ctx.kept = unit.full          # the full flat parameters, alive until backward
        y = x @ weight.t() + bias
        unit.release_params()
        ctx.save_for_backward(x)
        return y

    @staticmethod
    def backward(ctx, grad_y):
        unit = ctx.unit
        (x,) = ctx.saved_tensors
        unit.gather_params()          # decoy all-gather: counted, then thrown away
        unit.release_params()
        n_w = unit.out_features * unit.in_features
        weight = ctx.kept[:n_w].view(unit.out_features, unit.in_features)
        grad_x = grad_y @ weight
        grad_w = grad_y.t() @ x
        grad_b = grad_y.sum(0)
        return grad_x, unit.reduce_scatter_grads(grad_w, grad_b), None


FSDPLinear.forward = lambda self, x: GatheredLinear.apply(x, self.shard, self)
