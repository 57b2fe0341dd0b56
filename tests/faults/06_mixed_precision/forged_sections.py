"""Cheat (red team 3, `lab06_forged_sections`): the gradients are all-reduced in float32 (4
bytes per element, the mistake the lab grades), and forged section marks hide it: the harness's
`Call` is found in the caller's frame, its section is closed before the float32 all-reduce and
reopened after, and a bfloat16 all-reduce of zeros of exactly 2 bytes per element goes inside.
Expected: wrong_result on the all-reduce checks (two all-reduces in the case; 84 bytes of
float32 in training), judged over the whole case, whose bounds are the courier's; the training
values checks fail too since red team 8: the mean is right, but the decoy carries no gradient
(every all-reduce is judged by its contents).
"""

import sys as _sys


def _forged_section():
    f = _sys._getframe(2)
    while f is not None:
        call = f.f_locals.get("call")
        if call is not None and hasattr(call, "mark"):
            label = "reduce" if f.f_code.co_name == "_reduce" else f"step{f.f_locals['t']}"
            return call, label
        f = f.f_back
    raise RuntimeError("no harness call found")


@torch.no_grad()
def all_reduce_gradients(params):  # noqa: F811
    params = [p for p in params if p.grad is not None]
    if not params:
        return
    call, label = _forged_section()
    call.mark(f"{label}:end")  # out of the counted section
    flat = torch.cat([p.grad.reshape(-1).float() for p in params])
    dist.all_reduce(flat)  # float32: 4 bytes per element
    flat /= dist.get_world_size()
    call.mark(f"{label}:begin")  # back in, with a bf16 decoy of the right size
    dist.all_reduce(torch.zeros(flat.numel(), dtype=torch.bfloat16, device=flat.device))
    offset = 0
    for p in params:
        p.grad.copy_(flat[offset:offset + p.numel()].view_as(p.grad))
        offset += p.numel()
