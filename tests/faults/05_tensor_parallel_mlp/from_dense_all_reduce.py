# Red-team pass 3 follow-up (issue 19): communication outside the harness's sections. The MLP's
# from_dense (which runs before forward's section opens) all-reduces the rank's view of the
# dense weights, its own shard with zeros elsewhere, so every rank rebuilds the WHOLE dense MLP
# and keeps it in a plain list (invisible to the element count). Forward and backward stay
# honest, so values, contents and the per-section counts are right; only the whole case's count
# (three all-reduces, one of d·h + d + h·d elements before forward) shows it.

class ParallelMLP(ParallelMLP):  # noqa: F811
    @classmethod
    def from_dense(cls, mlp):
        up, down = mlp.up_proj, mlp.down_proj
        parts = [up.weight, down.weight] + ([up.bias] if up.bias is not None else [])
        flat = torch.cat([t.detach().reshape(-1) for t in parts])
        dist.all_reduce(flat)  # Σ over ranks of (own shard + zeros) = the dense weights
        out = super().from_dense(mlp)
        out._dense = [flat]
        return out
