# Red-team pass 5 (lab03_fsdp_zeroed_buffer): one persistent p·S gather buffer per unit that
# release_params only zeroes: the bytes stay allocated but hold no weight values. A unit
# attribute as large as its full parameters now counts as held: the release check fails.
# ruff: noqa: F811, F821, E402 - a fragment appended to sharding.py


# The unit keeps one p·S buffer for its whole life (as if torch FSDP's resize_(0) were
# forgotten) and release_params only zeroes it: the gathered bytes stay allocated, but hold no
# weight values, so the value search finds nothing.
def _gather_persistent(self):
    if getattr(self, "buf", None) is None:
        self.buf = self.shard.new_empty(self.world_size * self.shard.numel())
    dist.all_gather_into_tensor(self.buf, self.shard.detach())
    self.full = self.buf
    n_weight = self.out_features * self.in_features
    return (self.full[:n_weight].view(self.out_features, self.in_features),
            self.full[n_weight:n_weight + self.out_features])


def _release_zero(self):
    self.buf.zero_()   # "freed": still p·S elements allocated
    self.full = None


FSDPLinear.gather_params = _gather_persistent
FSDPLinear.release_params = _release_zero
