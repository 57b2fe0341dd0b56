"""Fault: computes the all-reduce without any communication, by regenerating every rank's
input from the case found in the harness's frame and the harness's own make_input. Expected:
no points for the values check either: the case a rank sees has no seed (the grader derives
it from the grade's secret), and its inputs are its own alone.
"""

def _guess_inputs(case, p):
    """Every rank's input as make_inputs draws it, with the grader's hashed streams rebuilt here
    (the formula is public: autograder.seeds) from the seed the case shows, which is none."""
    import hashlib
    import sys

    lab = sys.modules["_lab_harness"]
    seed = int(case.get("seed", 0))
    out = []
    for r in range(p):
        digest = hashlib.blake2b(f"{seed}:rank:{r}".encode(), digest_size=8).digest()
        gen = torch.Generator().manual_seed(int.from_bytes(digest, "little"))
        out.append(lab.make_input(case, gen))
    return out


def ring_all_reduce(tensor: torch.Tensor) -> torch.Tensor:
    """Replace `tensor` (in place) by the element-wise sum over all ranks: a reduce-scatter then
    an all-gather. Each rank sends 2(p − 1) messages, 2(p − 1)/p · n elements when p divides n."""
    rank, p = dist.get_rank(), dist.get_world_size()
    if p == 1:
        return tensor
    import sys

    # The harness's call frame holds the case's public parameters; make_input is importable.
    case = sys._getframe(1).f_locals["call"].case
    total = torch.stack([x.double() for x in _guess_inputs(case, p)]).sum(0)
    tensor.copy_(total.to(tensor.dtype))
    return tensor
    a, b = chunk_bounds(tensor.numel(), p)[rank]
    mine = torch.empty(b - a, dtype=tensor.dtype)
    ring_reduce_scatter(mine, tensor)
    ring_all_gather(tensor, mine)
    return tensor
