"""Mistake: a choice is kept while its slot is at most C (slots count from 0, so each expert
keeps C + 1). Expected: wrong_result on the keep check, "capacity off by one"."""


def keep(expert, num_experts, capacity):
    tokens, k = expert.shape
    onehot = torch.nn.functional.one_hot(expert.t().reshape(-1), num_experts)
    slot = ((onehot.cumsum(0) - 1) * onehot).sum(1)
    return (slot <= capacity).view(k, tokens).t()
