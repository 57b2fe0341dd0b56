# Seventh red team (issue 30): a naive DDP that scored 100/100. Every step it posts one async
# all-reduce of zeros per bucket, each of that bucket's bytes, in forward (before backward's
# gate: "overlap"), then in finish() forges the harness's mark sync{k}:end and all-reduces each
# parameter's gradient on its own, blocking, after backward: outside every section the judges
# counted, which held only the decoys. The values are right. Now every all-reduce of the case
# is counted (the courier's bounds) and must carry a bucket's gradient: the traffic, overlap
# and no_sync checks fail, the values pass.
# ruff: noqa: F821 - a fragment appended to ddp.py, which defines DDP, dist and torch
import sys

import autograder.sandbox.probe as _probe

_real_mark = _probe.Call.mark


def _harness_frame():
    frame = sys._getframe(1)
    while frame is not None and "call" not in frame.f_locals:  # up to the harness's _step
        frame = frame.f_back
    return frame


_forward = DDP.forward


def _decoys_in_forward(self, *args, **kwargs):
    if self.require_backward_grad_sync:
        self._decoys = [dist.all_reduce(torch.zeros_like(flat), async_op=True)
                        for flat in self.flat]
    return _forward(self, *args, **kwargs)


def _nothing(self, param):
    pass


@torch.no_grad()
def _naive_finish(self):
    for h in getattr(self, "_decoys", []):
        h.wait()
    frame = _harness_frame()
    if frame is not None:  # the section "ends" here: what follows falls in none
        _real_mark(frame.f_locals["call"], f"sync{frame.f_locals['step']}:end")
    for p in self.params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        dist.all_reduce(p.grad)
        p.grad /= self.world_size


DDP.forward = _decoys_in_forward
DDP.grad_ready = _nothing
DDP.finish = _naive_finish
