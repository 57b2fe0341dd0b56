"""Fault: lowers the resource limits of a process outside the sandbox (here a test's
`sleep 271.828` sentinel, whose pid the test writes below). Ranks may run as the grader's own
uid, and the kernel lets a process lower the limits of another process of its uid: the red team
set the grader's RLIMIT_CPU to 1 s this way and the grader died of SIGXCPU. Expected: refused
(the seccomp filter allows prlimit64 on the caller only); the sentinel's limits are unchanged.
"""

SENTINEL_PID = 0  # the test writes the sentinel's pid here


def ring_all_reduce(tensor: torch.Tensor) -> torch.Tensor:
    """Replace `tensor` (in place) by the element-wise sum over all ranks."""
    import resource
    resource.prlimit(SENTINEL_PID, resource.RLIMIT_NOFILE, (3, 3))
    return tensor
