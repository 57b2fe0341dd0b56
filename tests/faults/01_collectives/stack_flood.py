"""Attack: fill the grader's memory with stacks. Rank 0 posts 15,000 receives nobody will send
and, for each, writes a "wait" frame of its own carrying 40 frames of 600 characters (the most
a stack keeps: about 32 KB in the grader each, 0.5 GB in all), while rank 1 polls for a flag
without waiting on anything (so no deadlock is seen until rank 0 has sent them all); then both
wait on receives nobody sends. Expected: deadlock for this check, named with a few of rank 0's
calls (the grader keeps the stacks of at most MAX_STACKS calls a rank waits on); the other
checks pass; the grader's memory stays bounded.
"""

def ring_all_reduce(tensor: torch.Tensor) -> torch.Tensor:
    """Replace `tensor` (in place) by the element-wise sum over all ranks: a reduce-scatter then
    an all-gather. Each rank sends 2(p − 1) messages, 2(p − 1)/p · n elements when p divides n."""
    rank = dist.get_rank()
    flag = torch.zeros(1)
    if rank == 0:
        stack = [["/" + "s" * 499, 1, "f" * 100]] * 40
        for _ in range(15_000):
            work = dist.irecv(torch.zeros(1), 1, tag=99)
            work._link.send({"k": "wait", "id": work._id, "stack": stack})
        dist.send(flag, 1)
        dist.recv(flag, 1)
    elif rank == 1:
        work = dist.irecv(flag, 0)
        while not work.is_completed():
            pass
        dist.recv(flag, 0)
    return tensor
