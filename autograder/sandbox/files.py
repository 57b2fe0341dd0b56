"""Looking at and removing the folders ranks wrote, without trusting anything in them.

The grader (root, outside the sandbox) never opens a file a rank could have written: it lists
the ranks' folders with ``lstat`` semantics only (a symbolic link is an entry, never followed;
a FIFO is an entry, never opened), descends through directory descriptors (no path grows past
PATH_MAX, however deep the folders), counts every entry (files, folders, anything else) and
stops at a cap, so that 30,000 empty folders or 1,500 nested ones are numbers, not a crash.
`remove` empties a tree by moving each folder's subfolders up to the top before deleting its
files, so depth never becomes recursion or an open descriptor per level.
"""

from __future__ import annotations

import itertools
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

MAX_ENTRIES = 10_000  # files and folders a launch may leave in its ranks' folders
MAX_DEPTH = 4096      # folders below a rank's own (one descriptor each while scanning)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


@dataclass
class Usage:
    """What a folder holds, as far as the scan went."""

    bytes: int = 0
    """Disk blocks of regular files, in bytes."""
    entries: int = 0
    depth: int = 0
    named: list[str] = field(default_factory=list)
    """Relative paths of entries with a watched name (e.g. results.json), of any type."""

    @property
    def over(self) -> bool:
        return self.entries > MAX_ENTRIES or self.depth > MAX_DEPTH


def _list(fd: int) -> list[os.DirEntry]:
    try:
        with os.scandir(fd) as it:
            return list(itertools.islice(it, MAX_ENTRIES + 1))
    except OSError:
        return []


def scan(folder: Path, usage: Usage | None = None, watch: tuple[str, ...] = ()) -> Usage:
    """Add what `folder` holds to `usage`: bytes, entries, depth, watched names. Stops as soon
    as a cap (`MAX_ENTRIES`, `MAX_DEPTH`) is passed."""
    usage = usage or Usage()
    try:
        top = os.open(folder, _DIR_FLAGS)
    except OSError:
        return usage
    stack: list[tuple[int, list[str], str]] = []
    fd, rel = top, ""
    while True:
        subdirs = []
        for entry in _list(fd):
            usage.entries += 1
            if entry.name in watch:
                usage.named.append(f"{rel}{entry.name}")
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode):
                subdirs.append(entry.name)
            elif stat.S_ISREG(st.st_mode):
                usage.bytes += st.st_blocks * 512
        stack.append((fd, subdirs, rel))
        usage.depth = max(usage.depth, len(stack) - 1)
        if usage.over:
            break
        fd = -1
        while stack and fd < 0:
            parent, names, prefix = stack[-1]
            if not names:
                os.close(parent)
                stack.pop()
                continue
            name = names.pop()
            try:
                fd, rel = os.open(name, _DIR_FLAGS, dir_fd=parent), f"{prefix}{name}/"
            except OSError:
                fd = -1
        if fd < 0:
            break
    for parent, _, _ in stack:
        os.close(parent)
    return usage


def remove(folder: Path) -> None:
    """Delete `folder` and everything below it, following no link, at any depth."""
    try:
        if not stat.S_ISDIR(os.lstat(folder).st_mode):
            os.unlink(folder)
            return
        top = os.open(folder, _DIR_FLAGS)
    except OSError:
        return
    fresh = itertools.count()
    try:
        for _ in range(10 * MAX_ENTRIES + 1000):  # each round empties at least one folder
            entries = _list(top)
            if not entries:
                break
            for entry in entries:
                _clear_entry(top, entry, fresh)
    finally:
        os.close(top)
    try:
        os.rmdir(folder)
    except OSError:
        pass


def _clear_entry(top: int, entry: os.DirEntry, fresh: itertools.count) -> None:
    try:
        if not entry.is_dir(follow_symlinks=False):
            os.unlink(entry.name, dir_fd=top)
            return
        fd = os.open(entry.name, _DIR_FLAGS, dir_fd=top)
    except OSError:
        return
    try:
        os.fchmod(fd, 0o700)  # a folder its owner made unreadable
        for child in _list(fd):
            try:
                if child.is_dir(follow_symlinks=False):  # hoist it: depth never grows
                    os.rename(child.name, f".rm-{next(fresh)}-{os.getpid()}", src_dir_fd=fd,
                              dst_dir_fd=top)
                else:
                    os.unlink(child.name, dir_fd=fd)
            except OSError:
                pass
    finally:
        os.close(fd)
    try:
        os.rmdir(entry.name, dir_fd=top)
    except OSError:
        pass


__all__ = ["MAX_DEPTH", "MAX_ENTRIES", "Usage", "remove", "scan"]
