"""Red team of issue 30's sandbox: leaves a daemon behind (a process in a session of its own,
double-forked so that it is nobody's child) and then does the work correctly. Before, only the
launch's cgroup and the grader's sweep of its orphans ended such a process. Expected: full
marks, and the daemon ends with its rank (pid 1 of its namespace: the kernel kills every
process left in a pid namespace when its first process ends).
"""

_correct_ring_all_reduce = ring_all_reduce


def ring_all_reduce(tensor: torch.Tensor) -> torch.Tensor:  # noqa: F811
    import os

    if os.fork() == 0:  # the daemon: a session of its own, then orphaned at once
        os.setsid()
        if os.fork() == 0:
            os.execv("/bin/sleep", ["sleep", "317.31"])
        os._exit(0)
    return _correct_ring_all_reduce(tensor)
