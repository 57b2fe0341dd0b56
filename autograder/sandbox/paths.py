"""What a rank may read and write: what its world holds (`world_spec`: read-only binds and
device nodes, `world`) and Landlock's lists within it (`rank_paths`), computed for each rank.

Read: the interpreter and its packages, the system libraries, a few files of /etc the C
library and Python read (not the folder: as uid 0 without capabilities a rank still owns every
root-owned file, /etc/shadow included), its own /proc entry (``/proc/self``, resolved when the
rule is made) and the CPU's description, not the rest of /proc and /sys (another process's
name, command line and counters, a cgroup's task count, the host's memory: things a rank can
change about itself and another can read, i.e. channels), the random devices, the lab's code
folder (the student's files and the lab's harness), the rank-side half of the grader
(``autograder/sandbox``), `toolkit/arguments.py` (argument checks), and the `toolkit`
modules a lab names (`LabInfo.sandbox_modules`, e.g. the tiny models). Write: the rank's own
folder (plain files and folders only) and /dev/null. Nothing else: no other rank's folder, no
/dev/shm, no device node, not the lab (reference solution, hidden checks).

The world is built from the same list, so the two layers agree: what Landlock would refuse
is, apart from /proc and /sys, not there at all.
"""

from __future__ import annotations

import sys
from pathlib import Path

import toolkit

from .world import WorldSpec

ETC = ("/etc/ld.so.cache", "/etc/localtime", "/etc/passwd", "/etc/group", "/etc/nsswitch.conf",
       "/etc/os-release")
PROC = ("/proc/self", "/proc/cpuinfo", "/sys/devices/system/cpu")
DEV_READ = ("/dev/urandom", "/dev/random", "/dev/zero")
DEV_WRITE = ("/dev/null",)
# What a CUDA rank opens (NVIDIA's driver): the control and unified-memory nodes and one node
# per GPU (only the grade's GPUs are visible to CUDA; Landlock cannot tell them apart). Nodes
# that do not exist are left out (a Landlock rule needs an open path).
GPU_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")
GPU_READ = ("/proc/driver/nvidia", "/sys/bus/pci/devices", "/sys/devices")
SANDBOX = Path(__file__).resolve().parent


def gpu_nodes() -> list[str]:
    """The NVIDIA device nodes this host has (none here: no GPU)."""
    nodes = [*GPU_NODES, *(str(p) for p in sorted(Path("/dev").glob("nvidia[0-9]*"))),
             *(str(p) for p in sorted(Path("/dev").glob("nvidia-caps/nvidia-cap*")))]  # MIG
    return [n for n in nodes if Path(n).exists()]


def rank_paths(code: Path, home: Path, toolkit_modules=(), *,
               gpu: bool = False) -> tuple[list[str], list[str], list[str]]:
    """(read, write, list_only) for `landlock.restrict` for a rank whose lab files are in
    `code` and whose own folder is `home`; `gpu` adds the driver's /proc and /sys entries to
    `read` (the GPU nodes themselves are `gpu_nodes()`, given ioctl rights apart)."""
    pkg = Path(toolkit.__file__).resolve().parent
    read = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
            "/usr", "/lib", "/lib64", "/lib32", "/bin", *ETC, *PROC, *DEV_READ,
            str(Path(sys.executable).resolve().parent.parent)}
    for entry in sys.path:  # site-packages and friends (a venv's may sit outside its prefix)
        if entry and Path(entry).is_dir() and "site-packages" in entry:
            read.add(entry)
    # arguments.py: the argument checks that toolkit.models (a lab's sandbox module) imports.
    read |= {str(pkg / "__init__.py"), str(pkg / "arguments.py")}
    for name in toolkit_modules:  # what a lab's harness needs (LabInfo.sandbox_modules)
        if not name.replace("_", "").isalnum():
            raise ValueError(f"sandbox module {name!r} must be a plain toolkit module name")
        read |= {str(pkg / name), str(pkg / f"{name}.py")}
    read |= {str(SANDBOX), str(SANDBOX.parent / "__init__.py"), str(code)}
    write = [str(home), *DEV_WRITE]
    if gpu:
        read |= {p for p in GPU_READ if Path(p).exists()}
    list_only = [str(pkg), str(SANDBOX.parent)]
    return sorted(read), write, list_only


def world_spec(code: Path, home: Path, root: Path, toolkit_modules=(), *, gpu: bool = False,
               home_bytes: int, home_inodes: int, owner: int) -> WorldSpec:
    """The world of a rank whose lab files are in `code` and whose $HOME is `home`, built on
    the empty folder `root`: `rank_paths`' read list bound read-only (/proc and the devices
    apart: a fresh procfs, and the device nodes bound one by one), a tmpfs $HOME of
    `home_bytes` and `home_inodes` owned by `owner`. A cuda grade adds the GPU's nodes, the
    driver's /sys entries, and a procfs that keeps /proc/driver/nvidia."""
    read, _, _ = rank_paths(code, home, toolkit_modules, gpu=gpu)
    devices = set(DEV_READ) | set(DEV_WRITE) | (set(gpu_nodes()) if gpu else set())
    binds = [p for p in read if not p.startswith("/proc") and p not in devices]
    return WorldSpec(root=str(root), home=str(home), home_bytes=home_bytes,
                     home_inodes=home_inodes, owner=owner, read=binds, devices=sorted(devices),
                     proc_subset=not gpu)


__all__ = ["DEV_READ", "DEV_WRITE", "GPU_NODES", "GPU_READ", "gpu_nodes", "rank_paths",
           "world_spec"]
