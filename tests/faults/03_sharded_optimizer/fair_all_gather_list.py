# Not a fault: a correct FSDP gather written with dist.all_gather, the list form of the same
# collective (p tensors of S elements out, the S-element shard in: the same bytes to the same
# ranks). Red-team pass 3 (fair03_all_gather_list) found it refused (44 points lost); it is
# counted as an all-gather now, and every FSDP check passes.
# ruff: noqa: F821 - a fragment appended to sharding.py


def _gather(self):
    parts = [torch.empty_like(self.shard) for _ in range(self.world_size)]
    dist.all_gather(parts, self.shard.detach())
    self.full = torch.cat(parts)
    n_weight = self.out_features * self.in_features
    return (self.full[:n_weight].view(self.out_features, self.in_features),
            self.full[n_weight:n_weight + self.out_features])


FSDPLinear.gather_params = _gather
