"""The fork server's probe: what a confined rank sees of itself (`inspect`, run inside it, after
`confine`), and what must hold before any submission runs (`check_probe`, in the fork server).

A grade whose probe finds a problem refuses to run ranks (`zygote`, `server.SandboxRefused`):
better no grade than one whose ranks run as root, hold capabilities, see another process or
can write outside their $HOME.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from .limits import capability_sets
from .paths import world_spec
from .world import mounts, plan_binds


def _errno_of(step) -> int:
    try:
        step()
    except OSError as exc:
        return exc.errno or -1
    return 0


def _write_root() -> None:
    fd = os.open("/.probe", os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o600)
    os.close(fd)
    os.unlink("/.probe")


def inspect(spec: dict) -> dict:
    """Facts about this process, inside its world (after the seccomp filter: only calls a rank
    may make)."""
    caps = capability_sets()
    status = Path("/proc/self/status").read_text().splitlines()
    fields = dict(line.split(":", 1) for line in status if ":" in line)
    home = Path(spec["home"])
    world = world_spec(Path(spec["code"]), home, Path(spec["root"]), spec.get("toolkit", ()),
                       gpu=str(spec.get("device", "cpu")).startswith("cuda"), home_bytes=0,
                       home_inodes=0, owner=0)
    binds, _ = plan_binds([*world.read, *world.devices])
    ours = ["/proc", str(home), *binds]
    foreign = [m for m in mounts() if m != "/" and
               not any(m == p or m.startswith(p.rstrip("/") + "/") for p in ours)]
    return {"foreign_mounts": foreign, "uid": os.getuid(), "euid": os.geteuid(), "gid": os.getgid(),
            "caps": caps, "no_new_privs": fields.get("NoNewPrivs", "").strip(),
            "seccomp": fields.get("Seccomp", "").strip(),
            "pid": os.getpid(),
            "mounts": mounts(), "home": str(home),
            "write_root": _errno_of(_write_root),
            "write_home": _errno_of(lambda: (home / ".probe").write_text("x")),
            "chmod_code": _errno_of(lambda: os.chmod(spec["code"], 0o777))}


def check_probe(seen: dict) -> list[str]:
    """What is wrong with a probe's facts (empty when the world is as designed)."""
    problems = []
    if seen["uid"] == 0 or seen["euid"] == 0:
        problems.append("uid: the rank runs as uid 0")
    held = {name: value for name, value in seen["caps"].items() if value}
    if held:
        problems.append(f"capabilities: the rank holds {held}")
    if seen["pid"] != 1:  # a forked rank is pid 1 only of a pid namespace of its own
        problems.append(f"pid namespace: the rank is pid {seen['pid']}, not pid 1 of a "
                        "namespace of its own")
    if seen["write_root"] in (0, errno.EEXIST):
        problems.append("mounts: the rank can write its root folder")
    if seen["write_home"] != 0:
        problems.append(f"mounts: the rank cannot write its $HOME "
                        f"({os.strerror(seen['write_home'])})")
    if seen["chmod_code"] == 0:
        problems.append("metadata: the rank changed the code folder's mode")
    if seen["foreign_mounts"]:
        problems.append(f"mounts: mounts the world does not hold are visible: "
                        f"{seen['foreign_mounts'][:4]}")
    return problems


__all__ = ["check_probe", "inspect"]
