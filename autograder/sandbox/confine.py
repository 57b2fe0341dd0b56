"""Close every door of a freshly forked rank, in order, before any student code runs.

Run by a child of the fork server (`autograder.sandbox.zygote`, through
`namespaces.fork_isolated`: the rank is pid 1 of its own pid namespace and, when the grader is
not root, in a user namespace of its own), still trusted code:

1. descriptors: its channel becomes fd 3, its output pipes fds 1 and 2, /dev/null fd 0, and
   every other inherited descriptor is closed (the fork server's control socket, the other
   ranks' channels); a session of its own; mount, network, IPC and UTS namespaces of its own;
2. the launch's pids cgroup (root), so that the grader can end everything it starts, then a
   cgroup namespace rooted there;
3. rlimits (`limits.apply_rlimits`);
4. its world (`world.build`): a root of read-only binds, a procfs of its own pid namespace, a
   tmpfs $HOME; the host's tree is gone;
5. its uid (as root: its own, from the grade's block) and no capability (`limits.become`);
6. Landlock within the world: read the `paths.rank_paths` list, write only $HOME (plain files)
   and /dev/null, no TCP, signals and abstract sockets scoped to itself;
7. the seccomp filter (`seccomp`), last, since it refuses calls the steps above make;
8. its working folder is the code folder (read-only); HOME and TMPDIR are its $HOME.

Steps 2, 4 and 5 must hold: a failure raises `namespaces.IsolationError` naming the step and
what to do, and the grade refuses to run ranks (`zygote`'s probe). With ``unconfined`` in the
spec (``grade --unconfined`` only) the rank skips them and keeps what the host gives: a network
namespace where it may, Landlock, seccomp, no capabilities, its user's uid.

Returns what it applied, in words and numbers; the rank sends that as its first frame (before
any student code has run, so the grader may trust it) and the grade's report names it.
"""

from __future__ import annotations

import os
from pathlib import Path

from . import landlock, namespaces, seccomp
from .limits import Limits, apply_rlimits, become, capability_sets, has_capabilities
from .paths import gpu_nodes, rank_paths, world_spec
from .world import WorldError, build

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
    "namespaces": [...], "world": {...}, "seccomp": bool, "capabilities": bool, "uid": uid}.
    Raises `namespaces.IsolationError` where a layer that must hold could not be built."""
    _descriptors(channel, out, err)
    if spec.get("unconfined"):
        return _unconfined(spec)
    os.setsid()
    namespaces.unshare_rest()
    if spec.get("cgroup"):
        try:
            (Path(spec["cgroup"]) / "cgroup.procs").write_text("0")
        except OSError as exc:
            raise namespaces.IsolationError(
                f"pids cgroup: joining it failed ({exc.strerror})") from None
    namespaces.unshare_cgroup()
    uid = spec.get("uid")
    apply_rlimits(Limits(**spec["limits"]), uid, address_space=not _on_gpu(spec))
    home = Path(spec["home"])
    world = world_spec(Path(spec["code"]), home, Path(spec["root"]), spec.get("toolkit", ()),
                       gpu=_on_gpu(spec), home_bytes=int(spec["home_bytes"]),
                       home_inodes=int(spec["home_inodes"]),
                       owner=os.geteuid() if uid is None else int(uid))
    try:
        made = build(world)
    except WorldError as exc:
        raise namespaces.IsolationError(f"the rank's world: {exc.strerror}: "
                                        f"{namespaces.advice()}") from None
    become(uid)
    caps = capability_sets()
    if os.getuid() == 0 or os.geteuid() == 0 or caps.get("CapEff") or caps.get("CapPrm"):
        raise namespaces.IsolationError(
            f"uid and capabilities: the rank still runs as uid {os.getuid()} with CapEff "
            f"{caps.get('CapEff', 0):x}: {namespaces.advice()}")
    abi = _landlock(spec, home)
    filtered = seccomp.install() if spec.get("seccomp", True) else False
    _settle(spec)
    return {"landlock": abi, "features": landlock.features(abi),
            "namespaces": (["user"] if uid is None else []) + list(namespaces.RANK_NAMESPACES),
            "world": made, "seccomp": filtered, "capabilities": has_capabilities(),
            "uid": os.getuid(), "bounding": caps.get("CapBnd", 0)}


def _landlock(spec: dict, home: Path) -> int:
    abi = landlock.abi_version() if spec.get("landlock", True) else 0
    if abi >= 1:
        read, write, listing = rank_paths(Path(spec["code"]), home, spec.get("toolkit", ()),
                                          gpu=_on_gpu(spec))
        landlock.restrict(read, write, listing, write_rights=landlock.WRITE_PLAIN, tcp=False,
                          devices=gpu_nodes() if _on_gpu(spec) else ())
    return abi


def _settle(spec: dict) -> None:
    os.chdir(spec["code"])  # read-only: a file written "here" is refused, as it should be
    os.environ.clear()
    os.environ.update(rank_env(spec))


def _unconfined(spec: dict) -> dict:
    """``grade --unconfined``: what the host gives without privileges (the old best effort)."""
    if spec.get("cgroup"):
        try:
            (Path(spec["cgroup"]) / "cgroup.procs").write_text("0")
        except OSError:
            pass
    how = namespaces.isolate()
    apply_rlimits(Limits(**spec["limits"]), None, address_space=not _on_gpu(spec))
    become(None)
    abi = _landlock(spec, Path(spec["home"]))
    filtered = seccomp.install() if spec.get("seccomp", True) else False
    _settle(spec)
    return {"landlock": abi, "features": landlock.features(abi), "unconfined": True,
            "namespaces": ["network", "IPC"] if how else [], "seccomp": filtered,
            "capabilities": has_capabilities(), "uid": os.getuid()}


def _on_gpu(spec: dict) -> bool:
    return str(spec.get("device", "cpu")).startswith("cuda")


def rank_env(spec: dict) -> dict[str, str]:
    """A rank's whole environment: its folder, one thread, its rank, and the grade's GPU set
    (none on a CPU grade)."""
    home = str(spec["home"])
    gpus = str(spec.get("gpus", "")) if _on_gpu(spec) else ""
    return {"HOME": home, "TMPDIR": home, "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1",
            "CUDA_VISIBLE_DEVICES": gpus, "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1",
            # torch counts GPUs through NVML, not cuInit (what a student's code asks first)
            "PYTORCH_NVML_BASED_CUDA_CHECK": "1",
            "RANK": str(spec["rank"]), "WORLD_SIZE": str(spec["world_size"]),
            "LOCAL_RANK": str(spec["rank"])}


__all__ = ["CHANNEL_FD", "confine", "rank_env"]
