"""Not a cheat: a student trying fp8 all-reduces a float8_e4m3fn buffer, a dtype the grader's
channel does not carry (red team 3, fuzz06/f8: it was reported as "tampering ... forged").
Expected: exception on the all-reduce check, a TypeError naming float8_e4m3fn and the dtypes
that are carried, at the student's line.
"""


@torch.no_grad()
def all_reduce_gradients(params):  # noqa: F811
    params = [p for p in params if p.grad is not None]
    flat = torch.cat([p.grad.reshape(-1).float() for p in params]).to(torch.float8_e4m3fn)
    dist.all_reduce(flat)
