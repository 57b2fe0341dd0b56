"""Where one launch's ranks may write: each rank a folder of its own, on a fresh tmpfs.

As root the grader mounts a tmpfs per launch (``size`` = `Limits.disk_mb`, ``nr_inodes`` =
`files.MAX_ENTRIES` plus the ranks' own folders; ``nosuid,nodev,noexec``): the kernel itself
refuses the byte or the folder past the limit (ENOSPC), a disk bomb or 30,000 empty folders
cost nothing to measure, and unmounting frees everything at once, however it was nested, with
nothing left on the host's disk. Without root it is a plain folder in the grade's working
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

    def __init__(self, path: Path, world_size: int, *, disk_mb: float, uid: int | None) -> None:
        self.path, self.uid = path, uid
        path.mkdir(mode=0o711)
        self.mounted = False
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
        for home in self.homes:
            files.scan(home, usage, watch)
        return usage

    def close(self) -> None:
        if self.mounted:
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
