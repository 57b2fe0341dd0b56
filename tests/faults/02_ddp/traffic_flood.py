# Seventh red team (issue 30): a correct DDP that also makes 20,000 one-element async
# all-reduces in the first synchronised backward. The judge looked up each all-reduce's
# position with a linear scan (quadratic: 9.9 s a call at 20,000 entries), and judging time was
# added back to the grade's deadline: `grade --timeout 60` took 502 s. Now positions are
# indexed once and the count over the whole case is judged first: the traffic check fails at
# once (wrong_result, not the grade's time running out).
# ruff: noqa: F821 - a fragment appended to ddp.py, which defines DDP, dist and torch
_grad_ready = DDP.grad_ready


@torch.no_grad()
def _grad_ready_flooding(self, param):
    if not getattr(self, "_flooded", False):
        self._flooded = True
        one = torch.zeros(1, device=param.device)
        for h in [dist.all_reduce(one, async_op=True) for _ in range(20_000)]:
            h.wait()
    _grad_ready(self, param)


DDP.grad_ready = _grad_ready_flooding
