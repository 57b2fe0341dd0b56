# Red-team pass 6 (lab03_fsdp_parts_own_slot), an ordinary mistake: the list form's output list
# uses the shard itself as the rank's own slot, and the list is never dropped, so the other
# ranks' (p−1)·S elements stay on the unit. What the unit keeps is now searched for other
# ranks' chunks: the release check fails.
# ruff: noqa: F811, F821, E402 - a fragment appended to sharding.py


# dist.all_gather into a list whose own entry is the shard itself (it receives its own values),
# and release forgets the list. What stays on the unit besides the shard is (p-1)·S elements,
# less than the unit's full parameters, so `_unit_buffers` ignores it; no single storage holds
# the whole weight, so the value search misses it. The rank still holds every element of the
# gathered unit after forward.
def _gather_list(self):
    self.parts = [self.shard.detach() if k == self.rank else torch.empty_like(self.shard.detach())
                  for k in range(self.world_size)]
    dist.all_gather(self.parts, self.shard.detach())
    self.full = torch.cat(self.parts)
    n_weight = self.out_features * self.in_features
    return (self.full[:n_weight].view(self.out_features, self.in_features),
            self.full[n_weight:n_weight + self.out_features])


def _release_forgetful(self):
    self.full = None  # self.parts (the other ranks' shards) is never dropped


FSDPLinear.gather_params = _gather_list
FSDPLinear.release_params = _release_forgetful
