"""Mistake: the capacity rounds down (int() of cf·k·T/E). Expected: wrong_result on the
capacity check, "floor instead of ceil"."""


def expert_capacity(tokens, num_experts, *, top_k=1, capacity_factor=1.0):
    if capacity_factor is None:
        return tokens
    return int(capacity_factor * top_k * tokens / num_experts)
