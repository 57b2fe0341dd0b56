"""One private world per rank: a root of read-only binds, its own /proc and a tmpfs $HOME.

Run in a rank that already has its own mount and pid namespaces (`namespaces.fork_isolated`)
and still holds the capabilities to mount (root's, or those of its own user namespace), before
it gives them up. Mount namespaces, bind mounts and ``pivot_root`` are mount_namespaces(7),
mount(2), mount_setattr(2) and pivot_root(2); the order is the one bubblewrap follows
(bubblewrap's ``setup_newroot``), written here because a rank is a forked child of the fork
server, not a program bwrap could exec (docs/grading.md, "Why not bubblewrap").

1. Every mount becomes private, so nothing made below propagates back to the host.
2. A small tmpfs (`ROOT_BYTES`) is mounted on `WorldSpec.root`, an empty folder of the grade.
3. Each path of `WorldSpec.read` is bound there at its own path, recursively, then made
   read-only, nosuid and nodev (``mount_setattr`` with ``AT_RECURSIVE``): the interpreter and
   its packages, the system libraries, a few files of /etc, the lab's code folder. A path whose
   components are symbolic links (Debian's /lib → usr/lib) gets the same links, so every path
   the fork server imported from resolves the same way. Parent folders are the new root's own
   (mode 755): an interpreter under a mode-700 home is reachable by any uid without opening
   the home itself.
4. Device nodes (`WorldSpec.devices`: /dev/null, the random devices, a cuda grade's GPU nodes)
   are bound one by one, nosuid and noexec.
5. A fresh procfs, mounted from inside the rank's pid namespace: it lists the rank and its own
   children only; ``subset=pid`` (CPU grades) also hides the host-wide files (meminfo, loadavg,
   stat: counters another rank's work moves). A cuda grade keeps them (the driver's
   /proc/driver/nvidia).
6. $HOME: a tmpfs of the rank's own (``size``, ``nr_inodes``: the kernel refuses the byte or the
   file past its share of the launch's disk limit), owned by the rank's uid, mode 700, nosuid,
   nodev, noexec. No other rank's folder exists in this world, and its free space and inode
   counts are its own (no statvfs channel).
7. The new root is made read-only, ``pivot_root`` moves the rank into it and the host's tree
   is detached: nothing of the host, of other grades or of other ranks is left to name.
"""

from __future__ import annotations

import ctypes
import os
import platform
import stat
from dataclasses import dataclass, field
from pathlib import Path

MS_NOSUID, MS_NODEV, MS_NOEXEC = 2, 4, 8
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18
MNT_DETACH = 2
ATTR_RDONLY, ATTR_NOSUID, ATTR_NODEV, ATTR_NOEXEC = 1, 2, 4, 8
AT_FDCWD, AT_RECURSIVE = -100, 0x8000
_SYS_MOUNT_SETATTR = 442  # the same on x86_64 and aarch64 (Linux 5.12)
_SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
ROOT_BYTES = 8 << 20
"""Size of the new root's tmpfs: it holds only folders, empty mount points and links."""
ROOT_INODES = 8192


class WorldError(OSError):
    """A step of building the world failed; ``step`` names it in words."""

    def __init__(self, step: str, err: int, detail: str = "") -> None:
        super().__init__(err, f"{step}: {os.strerror(err)}" + (f" ({detail})" if detail else ""))
        self.step = step


@dataclass
class WorldSpec:
    """What one rank's world holds (`paths.world_spec` computes it)."""

    root: str
    """An empty folder of the grade to mount the new root on (in the rank's namespace only)."""
    home: str
    """The rank's $HOME and $TMPDIR: a tmpfs of its own at this path."""
    home_bytes: int
    home_inodes: int
    owner: int
    """The uid (and gid) that owns $HOME: the uid the rank will run as."""
    read: list[str] = field(default_factory=list)
    """Folders and files bound read-only at their own path."""
    devices: list[str] = field(default_factory=list)
    """Device nodes bound (writable where their permissions allow: /dev/null, a GPU)."""
    proc_subset: bool = True
    """procfs with ``subset=pid``: processes only, no host-wide files (not for cuda grades)."""


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, step: str, detail: str = "") -> None:
    if result != 0:
        raise WorldError(step, ctypes.get_errno() or 1, detail)


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str = "",
           *, step: str) -> None:
    _check(_libc.mount(source.encode() if source else None, target.encode(),
                       fstype.encode() if fstype else None, ctypes.c_ulong(flags),
                       data.encode() if data else None), step, target)


def _setattr(target: str, attrs: int, *, recursive: bool, step: str) -> None:
    attr = _MountAttr(attrs, 0, 0, 0)
    flags = AT_RECURSIVE if recursive else 0
    _check(_libc.syscall(_SYS_MOUNT_SETATTR, ctypes.c_int(AT_FDCWD), target.encode(),
                         ctypes.c_uint(flags), ctypes.byref(attr), ctypes.c_size_t(32)),
           step, target)


def links_on(path: str, depth: int = 0) -> list[tuple[str, str]]:
    """The symbolic links met while resolving `path` on the host, each (link, its target as
    stored), in an order where a link's own folder is real. A world that holds these links and
    ``realpath(path)`` resolves `path` as the host does."""
    if depth > 40:  # the kernel's own bound on nested links (ELOOP)
        return []
    found, cur = [], Path("/")
    for part in Path(path).parts[1:]:
        nxt = cur / part
        if nxt.is_symlink():
            target = os.readlink(nxt)
            found.append((str(nxt), target))
            found += links_on(os.path.normpath(nxt.parent / target), depth + 1)
            cur = nxt.resolve()
        else:
            cur = nxt
    return found


def plan_binds(paths: list[str]) -> tuple[list[str], list[tuple[str, str]]]:
    """(real paths to bind, links to make) for `paths`: missing paths dropped, each bound once,
    none below a folder already bound (it is there, the same file at the same path)."""
    real, links = set(), {}
    for path in paths:
        if not os.path.exists(path):  # missing, or a link to nothing
            continue
        real.add(os.path.realpath(path))
        links.update(links_on(os.path.abspath(path)))
    binds: list[str] = []
    for path in sorted(real):
        if not any(path.startswith(done.rstrip("/") + "/") for done in binds):
            binds.append(path)
    covered = [(link, target) for link, target in sorted(links.items())
               if not any(link.startswith(done.rstrip("/") + "/") for done in binds)]
    return binds, covered


def _mount_point(inside: str, like: str) -> None:
    """Make `inside` (a path in the new root) a folder or an empty file, as `like` is."""
    if os.path.isdir(like):
        os.makedirs(inside, mode=0o755, exist_ok=True)
        return
    os.makedirs(os.path.dirname(inside), mode=0o755, exist_ok=True)
    if not os.path.lexists(inside):
        os.close(os.open(inside, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o644))


def _bind(source: str, root: str, attrs: int, *, step: str) -> None:
    inside = root + source
    _mount_point(inside, source)
    _mount(source, inside, None, MS_BIND | MS_REC, step=step)
    _setattr(inside, attrs, recursive=True, step=step)


def _link(root: str, link: str, target: str) -> None:
    inside = root + link
    if os.path.lexists(inside):
        return
    os.makedirs(os.path.dirname(inside), mode=0o755, exist_ok=True)
    os.symlink(target, inside)


def _proc(root: str, subset: bool) -> None:
    target = root + "/proc"
    os.makedirs(target, mode=0o555, exist_ok=True)
    flags = MS_NOSUID | MS_NODEV | MS_NOEXEC
    try:
        _mount("proc", target, "proc", flags, "subset=pid" if subset else "", step="/proc")
    except WorldError:
        if not subset:
            raise
        # subset=pid needs Linux 5.8: a full procfs of the rank's pid namespace instead
        # (Landlock's list still keeps the rank to /proc/self and /proc/cpuinfo).
        _mount("proc", target, "proc", flags, step="/proc (pid namespace)")


def build(spec: WorldSpec) -> dict:
    """Build `spec`'s world and move this process into it (see the module docstring). Returns
    what it holds, in numbers, for the rank's report. Raises `WorldError` naming the step."""
    root = spec.root
    _mount(None, "/", None, MS_REC | MS_PRIVATE, step="making the host's mounts private")
    _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV,
           f"size={ROOT_BYTES},nr_inodes={ROOT_INODES},mode=0755", step="the new root's tmpfs")
    binds, links = plan_binds(spec.read)
    if "/" in binds:  # an interpreter installed at / would bind the whole host into the world
        raise WorldError("a read-only bind", 22, "the interpreter's prefix is / itself: install "
                         "Python (or the venv) in a folder of its own")
    for path in binds:
        _bind(path, root, ATTR_RDONLY | ATTR_NOSUID | ATTR_NODEV, step="a read-only bind")
    for link, target in links:
        _link(root, link, target)
    devices = [d for d in spec.devices if os.path.exists(d)
               and stat.S_ISCHR(os.stat(d).st_mode)]
    for node in devices:
        _bind(node, root, ATTR_NOSUID | ATTR_NOEXEC, step="a device node")
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                         ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
        _link(root, f"/dev/{name}", target)
    _proc(root, spec.proc_subset)
    home = root + spec.home
    os.makedirs(home, mode=0o755, exist_ok=True)
    _mount("tmpfs", home, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
           f"size={spec.home_bytes},nr_inodes={spec.home_inodes},mode=0700,"
           f"uid={spec.owner},gid={spec.owner}", step="$HOME's tmpfs")
    _setattr(root, ATTR_RDONLY | ATTR_NOSUID | ATTR_NODEV, recursive=False,
             step="the new root, read-only")
    _pivot(root)
    return {"binds": len(binds), "devices": len(devices), "home_mb": spec.home_bytes / 2**20,
            "proc": "processes only" if spec.proc_subset else "its pid namespace"}


def _pivot(root: str) -> None:
    """pivot_root(2)'s "new_root == put_old" idiom: the old root ends stacked on the new one,
    and is detached from there."""
    number = _SYS_PIVOT_ROOT.get(platform.machine())
    if number is None:
        raise WorldError("pivot_root", 38, f"unknown architecture {platform.machine()}")
    os.chdir(root)
    _check(_libc.syscall(number, b".", b"."), "pivot_root", root)
    _check(_libc.umount2(b".", MNT_DETACH), "detaching the host's tree")
    os.chdir("/")


def mounts() -> list[str]:
    """This process's mount points, from /proc/self/mountinfo (a rank's self-check)."""
    with open("/proc/self/mountinfo") as f:
        return [line.split()[4].encode().decode("unicode_escape") for line in f]


__all__ = ["ROOT_BYTES", "WorldError", "WorldSpec", "build", "links_on", "mounts",
           "plan_binds"]
