# Fairness (red-team pass 6, fair03_fsdp_input_on_unit): a correct FSDP that keeps x for
# backward on the unit instead of in ctx. An activation on the unit is not gathered memory:
# full marks.
# ruff: noqa: F811, F821, E402 - a fragment appended to sharding.py


# ctx (as a hand-written layer with its own backward would). It holds exactly what
# ctx.save_for_backward(x) holds (the activation autograd needs anyway), never a parameter; the
# gathered weight is released in forward and gathered again in backward.
def _fwd(ctx, x, shard, unit):
    ctx.unit = unit
    weight, bias = unit.gather_params()
    y = x @ weight.t() + bias
    unit.release_params()
    unit.saved_x = x.detach()  # the input, for backward (instead of ctx.save_for_backward)
    return y


def _bwd(ctx, grad_y):
    unit = ctx.unit
    x, unit.saved_x = unit.saved_x, None
    weight, bias = unit.gather_params()
    grad_x = grad_y @ weight
    grad_weight = grad_y.t() @ x
    grad_bias = grad_y.sum(0)
    unit.release_params()
    return grad_x, unit.reduce_scatter_grads(grad_weight, grad_bias), None


GatheredLinear.forward = staticmethod(_fwd)
GatheredLinear.backward = staticmethod(_bwd)
