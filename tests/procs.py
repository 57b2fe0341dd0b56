"""Process helpers for tests."""

from __future__ import annotations

import random
import socket
from pathlib import Path

import psutil


def gone(pid: int) -> bool:
    """True when `pid` no longer exists (a zombie counts as still there: nobody reaped it)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_DEAD
    except psutil.NoSuchProcess:
        return True


def free_ports(n: int = 1) -> list[int]:
    """`n` distinct TCP ports on 127.0.0.1, free now, for a server a test starts later
    (torchrun's rendezvous, slurmctld). They are drawn below the kernel's ephemeral range
    (/proc/sys/net/ipv4/ip_local_port_range), which the kernel never hands to a socket bound to
    port 0 or connecting out: the other xdist worker's gloo ranks cannot take one in the
    seconds before the server binds it, as they could take a port that bind(0) had chosen."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768  # Linux's default start
    draw = random.SystemRandom()
    held: list[socket.socket] = []
    try:
        for _ in range(200 * n):
            if len(held) == n:
                break
            s = socket.socket()
            port = draw.randrange(20000, low) if low > 20000 + 10 * n else 0
            try:
                s.bind(("127.0.0.1", port))  # held until all n are drawn: n distinct ports
            except OSError:
                s.close()
                continue
            held.append(s)
        if len(held) < n:
            raise RuntimeError(f"no {n} free ports below {low} on 127.0.0.1")
        return [s.getsockname()[1] for s in held]
    finally:
        for s in held:
            s.close()
