"""Mistake: combine adds the experts' outputs without their gates. Expected: wrong_result on the
2-rank layer check (top-1), "combine without gate weights"."""


def combine(expert_out, gate, dispatched):
    s = dispatched.state
    back = torch.empty_like(s["order"])
    back[s["order"]] = torch.arange(s["order"].numel(), device=expert_out.device)
    returned = Exchange.apply(expert_out[back], s["out_splits"], s["in_splits"], s["group"])
    return returned.new_zeros(s["tokens"], returned.shape[1]).index_add(0, s["token"], returned)
