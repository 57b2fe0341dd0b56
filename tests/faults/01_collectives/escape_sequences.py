"""Fault: prints OSC and CSI escape sequences (retitle the terminal, clear it, set the
clipboard) and raises an exception whose message holds more. Expected: exception, and no raw
escape character in the report or results.json.
"""

def ring_all_reduce(tensor: torch.Tensor) -> torch.Tensor:
    """Replace `tensor` (in place) by the element-wise sum over all ranks: a reduce-scatter then
    an all-gather. Each rank sends 2(p − 1) messages, 2(p − 1)/p · n elements when p divides n."""
    rank, p = dist.get_rank(), dist.get_world_size()
    if p == 1:
        return tensor
    import sys
    print("\x1b]0;graded 100/100\x07\x1b[2J\x1b[31mRED\x1b[0m", flush=True)
    print("\x1b]52;c;cm0gLXJmIH4=\x07", file=sys.stderr, flush=True)
    raise RuntimeError("bad \x1b[2J\x1b]0;pwned\x07\u202egnp.exe news")
