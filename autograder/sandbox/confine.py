"""Close every door of a freshly forked rank, in order, before any student code runs.

Run by the fork server's child (`autograder.sandbox.zygote`), still trusted code:

1. descriptors: its channel becomes fd 3, its output pipes fds 1 and 2, /dev/null fd 0, and
   every other inherited descriptor is closed (the fork server's control socket, the other
   ranks' channels);
2. the launch's pids cgroup (root), so that the grader can end everything it starts;
3. network and IPC namespaces of its own (`namespaces.isolate`);
4. rlimits (`limits.apply_rlimits`), then the grade's uid or no capabilities (`limits.become`);
5. Landlock: read the `paths.rank_paths` list, write only its own folder (plain files) and
   /dev/null, no TCP, signals and abstract sockets scoped to itself;
6. the seccomp filter (`seccomp`), last, since it refuses calls the steps above make;
7. its working folder is the code folder (read-only); HOME and TMPDIR are its own folder.

Returns what it could apply, in words; the rank sends that as its first frame (before any
student code has run, so the grader may trust it) and the grade's report names what is missing.
"""

from __future__ import annotations

import os
from pathlib import Path

from . import landlock, namespaces, seccomp
from .limits import Limits, apply_rlimits, become, has_capabilities
from .paths import rank_paths

CHANNEL_FD = 3


def _descriptors(channel: int, out: int, err: int) -> None:
    devnull = os.open(os.devnull, os.O_RDONLY)
    for src, dst in ((devnull, 0), (out, 1), (err, 2)):
        if src != dst:
            os.dup2(src, dst)
    if channel != CHANNEL_FD:
        os.dup2(channel, CHANNEL_FD)
    os.closerange(CHANNEL_FD + 1, 65536)
    os.set_inheritable(CHANNEL_FD, False)


def confine(spec: dict, *, channel: int, out: int, err: int) -> dict:
    """Apply every layer to this process; returns {"landlock": abi, "features": [...],
    "namespaces": how, "seccomp": bool, "capabilities": bool, "uid": uid}."""
    _descriptors(channel, out, err)
    if spec.get("cgroup"):
        try:
            (Path(spec["cgroup"]) / "cgroup.procs").write_text("0")
        except OSError:
            pass
    how = namespaces.isolate()
    apply_rlimits(Limits(**spec["limits"]), spec.get("uid"))
    become(spec.get("uid"))
    home = Path(spec["home"])
    abi = landlock.abi_version() if spec.get("landlock", True) else 0
    if abi >= 1:
        read, write, listing = rank_paths(Path(spec["code"]), home, spec.get("toolkit", ()),
                                          gpu=_on_gpu(spec))
        landlock.restrict(read, write, listing, write_rights=landlock.WRITE_PLAIN, tcp=False)
    filtered = seccomp.install() if spec.get("seccomp", True) else False
    os.chdir(spec["code"])  # read-only: a file written "here" is refused, as it should be
    os.environ.clear()
    os.environ.update(rank_env(spec))
    return {"landlock": abi, "features": landlock.features(abi), "namespaces": how,
            "seccomp": filtered, "capabilities": has_capabilities(), "uid": os.getuid()}


def _on_gpu(spec: dict) -> bool:
    return str(spec.get("device", "cpu")).startswith("cuda")


def rank_env(spec: dict) -> dict[str, str]:
    """A rank's whole environment: its folder, one thread, its rank, and the grade's GPU set
    (none on a CPU grade)."""
    home = str(spec["home"])
    gpus = str(spec.get("gpus", "")) if _on_gpu(spec) else ""
    return {"HOME": home, "TMPDIR": home, "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1",
            "CUDA_VISIBLE_DEVICES": gpus, "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1",
            "RANK": str(spec["rank"]), "WORLD_SIZE": str(spec["world_size"]),
            "LOCAL_RANK": str(spec["rank"])}


__all__ = ["CHANNEL_FD", "confine", "rank_env"]
