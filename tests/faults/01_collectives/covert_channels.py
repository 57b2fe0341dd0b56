"""Red-team of the sandbox (issue 19's review): every channel between two ranks, or out of a
rank, that no file rule covers, tried in turn: kernel keyrings, file locks on a file both ranks
can read, leases and directory notices, inotify, System V shared memory and message queues,
POSIX message queues, a user namespace, another rank's memory through /proc, another process's
name and command line (a rank can rename itself, `prctl(PR_SET_NAME)`), the launch cgroup's task
count and the host's memory counters (both change with what a rank does), a signal to the fork
server. Expected: the rank raises a report that lists none as open.
"""

def ring_all_reduce(tensor: torch.Tensor) -> torch.Tensor:
    """Replace `tensor` (in place) by the element-wise sum over all ranks: a reduce-scatter then
    an all-gather. Each rank sends 2(p − 1) messages, 2(p − 1)/p · n elements when p divides n."""
    rank, p = dist.get_rank(), dist.get_world_size()
    if p == 1:
        return tensor
    import ctypes
    import fcntl
    import os
    import signal
    import sys

    libc = ctypes.CDLL(None, use_errno=True)
    mine = sys.modules["_lab_harness"].__file__

    def syscall(*args):
        if libc.syscall(*args) < 0:
            raise OSError(ctypes.get_errno(), "refused")

    def peer_memory():
        for pid in os.listdir("/proc"):
            if pid.isdigit() and int(pid) != os.getpid():
                try:
                    with open(f"/proc/{pid}/cwd/{os.path.basename(mine)}", "rb"):
                        pass
                    with open(f"/proc/{pid}/mem", "rb") as f:
                        f.read(1)
                        return
                except (PermissionError, FileNotFoundError, ProcessLookupError):
                    continue
        raise PermissionError("no peer's memory could be opened")

    tries = {
        "keyring": lambda: syscall(248, b"user", b"grade", b"bits", 4, -4),
        "flock": lambda: fcntl.flock(os.open(mine, os.O_RDONLY), fcntl.LOCK_EX | fcntl.LOCK_NB),
        "fcntl lock": lambda: fcntl.lockf(os.open(mine, os.O_RDONLY), fcntl.LOCK_SH),
        "directory notice": lambda: fcntl.fcntl(os.open(".", os.O_RDONLY), 1026, 0x80000001),
        "inotify": lambda: syscall(294, 0),
        "sysv shm": lambda: syscall(29, 0, 4096, 0o1600),
        "sysv msg": lambda: syscall(68, 0, 0o1600),
        "posix mq": lambda: syscall(240, b"/grade", 0o102, 0o600, None),
        "user namespace": lambda: syscall(272, 0x10000000),
        "peer memory": peer_memory,
        "peer name": lambda: open(f"/proc/{os.getppid()}/comm").read(),
        "peer command line": lambda: open(f"/proc/{os.getppid()}/cmdline").read(),
        "cgroup task count": lambda: open("/proc/self/cgroup").read() and [
            open(f"/sys/fs/cgroup/{c}/pids.current").read() for c in ("pids", "unified")],
        "host memory": lambda: open("/proc/meminfo").read(),
        # A rank is pid 1 of its own pid namespace: its parent has no pid there (getppid() is
        # 0, and kill(0) would be its own group), so every process it may signal instead.
        "kill fork server": lambda: os.kill(os.getppid() or -1, signal.SIGKILL),
    }
    opened, refused = [], []
    for name, attempt in tries.items():
        try:
            attempt()
            opened.append(name)
        except OSError:
            refused.append(name)
    raise RuntimeError(f"channels open: {opened}; refused: {refused}")
