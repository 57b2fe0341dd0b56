"""Mistake: slots are counted token by token (token t's second choice before token t+1's first),
so the wrong choices are dropped. Expected: wrong_result on the keep check, "tokens dropped in
the wrong order"."""


def keep(expert, num_experts, capacity):
    onehot = torch.nn.functional.one_hot(expert.reshape(-1), num_experts)
    slot = ((onehot.cumsum(0) - 1) * onehot).sum(1)
    return (slot < capacity).view_as(expert)
