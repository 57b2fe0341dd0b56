# Issue 31 §3: one missing division (finish() copies the all-reduced sum into .grad without
# dividing by the world size). It scored 12/100 with 8 of 10 checks failing on the same
# "summed" message, the traffic checks included. The traffic checks judge what each
# all-reduce carried (the rank's own bucket gradients), whatever the values: they pass, and
# the values checks name the mistake.
# ruff: noqa: F821 - a fragment appended to ddp.py, which defines DDP and torch
_finish = DDP.finish


@torch.no_grad()
def _finish_summed(self):
    world_size = self.world_size
    self.world_size = 1  # flat.div_(1): the sum stays
    try:
        _finish(self)
    finally:
        self.world_size = world_size


DDP.finish = _finish_summed
