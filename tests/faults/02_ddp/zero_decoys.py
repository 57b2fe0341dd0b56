# Red-team pass 3 (lab02_zero_decoys): a naive DDP (one blocking all-reduce of every gradient
# after backward: no buckets, no overlap) that makes the counts with n_buckets − 1 EMPTY async
# all-reduces started from the first gradient hook. Zero-byte calls carry nothing and are not
# counted, so the traffic check sees one all-reduce for the case's buckets and the overlap
# check (which judges traffic first) fails too; the values stay right.
# ruff: noqa: F821 - a fragment appended to ddp.py, which defines DDP, dist and torch


def _grad_ready(self, param):
    if not getattr(self, "_decoys_started", False):
        self._decoys_started = True
        empty = torch.zeros(0, device=param.device)
        self._decoys = [dist.all_reduce(empty, async_op=True)
                        for _ in range(len(self.buckets) - 1)]


@torch.no_grad()
def _finish(self):
    for h in getattr(self, "_decoys", []):
        h.wait()
    self._decoys, self._decoys_started = [], False
    flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                      for p in self.params])
    dist.all_reduce(flat)  # one blocking all-reduce after backward: no overlap
    flat /= self.world_size
    off = 0
    for p in self.params:
        p.grad = flat[off:off + p.numel()].view_as(p).clone()
        off += p.numel()


DDP.grad_ready = _grad_ready
DDP.finish = _finish
