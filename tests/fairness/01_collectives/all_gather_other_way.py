"""Fair: the all-gather runs round the ring the other way (to rank − 1, from rank + 1), so an
all-reduce built from it has phases in opposite directions; each phase is a ring (second red
team: the check once pooled both phases' peers).
"""
# ruff: noqa: F811, F821 - appended to collectives.py (defines torch, dist, exchange, ...)


def ring_all_gather(output: torch.Tensor, input: torch.Tensor) -> torch.Tensor:
    rank, p = dist.get_rank(), dist.get_world_size()
    bounds = chunk_bounds(output.numel(), p)
    out = output.view(-1)
    a, b = bounds[rank]
    out[a:b].copy_(input.reshape(-1))
    right, left = (rank - 1) % p, (rank + 1) % p
    for step in range(p - 1):
        sent, got = (rank + step) % p, (rank + step + 1) % p
        (sa, sb), (ga, gb) = bounds[sent], bounds[got]
        exchange(out[sa:sb], right, out[ga:gb], left)
    return output
