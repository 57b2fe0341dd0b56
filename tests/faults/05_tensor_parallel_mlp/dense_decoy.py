# Red-team pass 3 (issue 19), lab05_dense_decoy: every rank computes the WHOLE dense MLP.
# from_dense keeps the honest shards as parameters (so the shard values, their gradients and the
# element count are right) and a copy of the dense weights in a plain list (the harness counts
# tensors in _parameters, _buffers and tensor attributes only). Forward rebuilds the full
# weights around the shard parameters (so autograd gives each shard its own slice of the dense
# gradient), runs the dense MLP locally, and all-reduces a tensor of zeros of the (.., h) size
# in forward and in backward: right count, right bytes, no partial sum ever exchanged.

class _Decoy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        dist.all_reduce(torch.zeros_like(x))      # forward decoy: (.., h), zeros
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        dist.all_reduce(torch.zeros_like(grad))   # backward decoy: (.., h), zeros
        return grad


class ParallelMLP(nn.Module):  # noqa: F811
    def __init__(self, up_proj, down_proj, dense=None):
        super().__init__()
        self.up_proj, self.down_proj = up_proj, down_proj
        self._dense = dense or []                # a list: invisible to the element count

    @classmethod
    def from_dense(cls, mlp):
        up = ColumnParallelLinear.from_dense(mlp.up_proj)
        down = RowParallelLinear.from_dense(mlp.down_proj)
        d = [mlp.up_proj.weight.detach().clone(),
             None if mlp.up_proj.bias is None else mlp.up_proj.bias.detach().clone(),
             mlp.down_proj.weight.detach().clone()]
        return cls(up, down, d)

    def forward(self, x):
        w1, b1, w2 = self._dense
        r1 = shard_range(w1.shape[0])
        r2 = shard_range(w2.shape[1])
        W1 = torch.cat([w1[:r1.start], self.up_proj.weight, w1[r1.stop:]], 0)
        B1 = None if b1 is None else torch.cat([b1[:r1.start], self.up_proj.bias, b1[r1.stop:]])
        W2 = torch.cat([w2[:, :r2.start], self.down_proj.weight, w2[:, r2.stop:]], 1)
        x = _Decoy.apply(x)
        return F.linear(F.gelu(F.linear(x, W1, B1)), W2, self.down_proj.bias)
