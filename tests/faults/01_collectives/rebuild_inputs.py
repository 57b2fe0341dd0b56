"""Fault (issue 19, cheat 2): rebuild every rank's input from what the harness's frames and
module hold, then send garbage of the right sizes around the ring so the traffic looks right.
Expected: no points for the values or the traffic check (the inputs come from the grade's
secret, delivered to each rank alone; the courier sees what every message carried).
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

    call = sys._getframe(1).f_locals["call"]  # the harness's frame: public parameters only
    guess = _guess_inputs(call.case, p)
    n = tensor.numel()
    bounds = chunk_bounds(n, p)
    right, left = (rank + 1) % p, (rank - 1) % p
    for step in range(2 * (p - 1)):  # the ring's pattern and sizes, with random values
        a, b = bounds[(rank - step) % p]
        c, d = bounds[(rank - step - 1) % p]
        exchange(torch.randn(b - a).to(tensor.dtype), right,
                 torch.empty(d - c, dtype=tensor.dtype), left)
    tensor.copy_(torch.stack([g.double() for g in guess]).sum(0).to(tensor.dtype))
    return tensor
