# Red-team pass 4 (lab03_fsdp_storage): FSDP that keeps the gathered flat parameters alive from
# forward to backward as a torch.UntypedStorage in a ctx attribute (not a Tensor, which the
# harness's walk of live tensors looked for) and rebuilds a tensor on it in backward, with a
# decoy all-gather so the count stays right. The harness now walks every storage the garbage
# collector reaches (behind tensors, storage objects and numpy arrays, and what tracked
# objects refer to) for a unit's full weight at any offset: the traffic-and-release check
# fails; the values stay right.
# ruff: noqa: F811, F821 - a fragment appended to sharding.py

class GatheredLinear(torch.autograd.Function):  # noqa: F811
    @staticmethod
    def forward(ctx, x, shard, unit):
        ctx.unit = unit
        weight, bias = unit.gather_params()
        full = unit.full.detach().clone()          # own copy: release_params may free in place
        ctx.kept = full.untyped_storage()          # a storage, not a tensor
        ctx.meta = (full.dtype, full.numel())
        del full
        y = x @ weight.t() + bias
        unit.release_params()
        ctx.save_for_backward(x)
        return y

    @staticmethod
    def backward(ctx, grad_y):
        unit = ctx.unit
        (x,) = ctx.saved_tensors
        unit.gather_params()                       # decoy all-gather: counted, then thrown away
        unit.release_params()
        dtype, numel = ctx.meta
        full = torch.empty(0, dtype=dtype, device=grad_y.device).set_(ctx.kept, 0, (numel,))
        n_w = unit.out_features * unit.in_features
        weight = full[:n_w].view(unit.out_features, unit.in_features)
        grad_x = grad_y @ weight
        grad_w = grad_y.t() @ x
        grad_b = grad_y.sum(0)
        return grad_x, unit.reduce_scatter_grads(grad_w, grad_b), None


FSDPLinear.forward = lambda self, x: GatheredLinear.apply(x, self.shard, self)
