"""Where one launch's ranks may write: each rank a folder of its own, on a fresh tmpfs.

In the sandbox (``private``) each rank mounts a tmpfs of its own at its $HOME inside its own
world (`world`): its share of the launch's disk limit (``size`` = `Limits.disk_mb` / p,
``nr_inodes`` = `files.MAX_ENTRIES` / p), refused by the kernel past it (ENOSPC), invisible to
every other rank and to the host, and gone with the rank's mount namespace when it ends. The
grader then only makes the launch's folder, the empty mount point of its ranks' roots, and
never reads anything a rank wrote.

With ``grade --unconfined`` (no worlds), the older scheme: as root the grader mounts a tmpfs
per launch (``size`` = `Limits.disk_mb`, ``nr_inodes`` = `files.MAX_ENTRIES` plus the ranks'
own folders; ``nosuid,nodev,noexec``): the kernel itself refuses the byte or the folder past
the limit (ENOSPC), and unmounting frees everything at once, with nothing left on the host's
disk. Without root it is a plain folder in the grade's working
folder, measured by the watchdog (`files.scan`) and removed with `files.remove`.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

from . import files

_MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MNT_DETACH = 2, 4, 8, 2


class Scratch:
    """The writable folders of one launch of `world_size` ranks."""

    def __init__(self, path: Path, world_size: int, *, disk_mb: float, uid: int | None,
                 private: bool = False) -> None:
        self.path, self.uid, self.private = path, uid, private
        path.mkdir(mode=0o711)
        self.mounted = private  # the kernel enforces the limits in each rank's own tmpfs
        self.home_bytes = int(disk_mb * 2**20 / world_size)
        self.home_inodes = files.MAX_ENTRIES // world_size + 8
        if private:
            self.homes = [path / f"r{rank}" for rank in range(world_size)]
            return
        if os.geteuid() == 0:
            opts = (f"size={int(disk_mb * 2**20)},nr_inodes={files.MAX_ENTRIES + world_size + 2},"
                    "mode=0711").encode()
            libc = ctypes.CDLL(None, use_errno=True)
            self.mounted = libc.mount(b"tmpfs", str(path).encode(), b"tmpfs",
                                      _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, opts) == 0
        self.homes = []
        for rank in range(world_size):
            home = path / f"r{rank}"
            home.mkdir(mode=0o700)
            if uid is not None:
                os.chown(home, uid, uid)
            self.homes.append(home)

    def usage(self, watch: tuple[str, ...] = ()) -> files.Usage:
        usage = files.Usage()
        if self.private:  # in the ranks' own worlds: nothing here to look at
            return usage
        for home in self.homes:
            files.scan(home, usage, watch)
        return usage

    def close(self) -> None:
        if self.mounted and not self.private:
            unmount(self.path)
            self.mounted = False
        files.remove(self.path)


def unmount(path: Path) -> bool:
    """Detach the mount at `path` (lazily: it goes once nothing uses it)."""
    return ctypes.CDLL(None, use_errno=True).umount2(str(path).encode(), _MNT_DETACH) == 0


def unmount_below(folder: Path) -> list[str]:
    """Detach every mount at or below `folder` (a grade that failed half-way); returns them."""
    found = []
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                point = line.split()[4].encode().decode("unicode_escape")
                if point == str(folder) or point.startswith(f"{folder}/"):
                    found.append(point)
    except OSError:
        return []
    for point in sorted(found, reverse=True):
        unmount(Path(point))
    return found


__all__ = ["Scratch", "unmount", "unmount_below"]
