"""Process helpers for tests."""

from __future__ import annotations

import psutil


def gone(pid: int) -> bool:
    """True when `pid` no longer exists (a zombie counts as still there: nobody reaped it)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_DEAD
    except psutil.NoSuchProcess:
        return True
