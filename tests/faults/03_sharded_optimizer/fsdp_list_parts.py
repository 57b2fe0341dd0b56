# Red-team pass 5 (lab03_fsdp_list_parts), an ordinary mistake: gather_params all-gathers into a
# list of p shard-sized tensors (the list form the README allows) and release_params forgets the
# list, so the whole gathered unit stays alive after forward in p storages, none holding a whole
# weight. The release walk now also looks for other ranks' chunks: the release check fails.
# ruff: noqa: F811, F821, E402 - a fragment appended to sharding.py


# gather_params all-gathers into a list of p shard-sized tensors and concatenates them;
# release_params drops the concatenation but FORGETS the list: p·S elements (the whole gathered
# unit) stay alive after forward, split over p storages, none of which holds a whole weight.
def _gather_list(self):
    self.parts = [torch.empty_like(self.shard.detach()) for _ in range(self.world_size)]
    dist.all_gather(self.parts, self.shard.detach())
    self.full = torch.cat(self.parts)
    n_weight = self.out_features * self.in_features
    return (self.full[:n_weight].view(self.out_features, self.in_features),
            self.full[n_weight:n_weight + self.out_features])


def _release_forgetful(self):
    self.full = None  # self.parts is never dropped


FSDPLinear.gather_params = _gather_list
FSDPLinear.release_params = _release_forgetful
