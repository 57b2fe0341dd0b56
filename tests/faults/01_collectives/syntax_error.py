"""Fault: a missing closing parenthesis. Expected: syntax_error on every check, found
before anything runs.
"""


def ring_all_gather(output: torch.Tensor, input: torch.Tensor) -> torch.Tensor:
    """Fill `output` (n elements) with every rank's `input`, rank i's at chunk_bounds(n, p)[i].
    Ring: p − 1 steps, each passing the chunk received last to rank + 1."""
    rank, p = dist.get_rank(), dist.get_world_size()
    bounds = chunk_bounds(output.numel(), p)
    out = output.view(-1)
    out[slice(*bounds[rank])] = input.reshape(-1)
    right, left = (rank + 1) % p, (rank - 1 % p
    for step in range(p - 1):
        sent, got = (rank - step) % p, (rank - step - 1) % p
        exchange(out[slice(*bounds[sent])], right, out[slice(*bounds[got])], left)
    return output
