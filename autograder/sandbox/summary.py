"""The report's sandbox line: what each rank of a grade got, in words, from rank 0's confinement
report (`confine`, sent before any student code ran), and what this host could not give."""

from __future__ import annotations

from .cgroup import PidsGroup

UNCONFINED = ("NOT SANDBOXED (grade --unconfined): the ranks ran without worlds, uids or "
              "namespaces of their own; a submission could read and change what your user "
              "can. This grade is for your own work only")


def describe(confined: dict, group: PidsGroup | None, uid: int | None,
             scratch_tmpfs: bool) -> tuple[str, list[str]]:
    """(what the sandbox was, what it lacked) from rank 0's confinement report; `uid` is the
    first of the grade's uids (root), None in a user namespace."""
    have, missing = [], []
    if confined.get("unconfined"):
        have.append(UNCONFINED)
        missing.append(UNCONFINED)
        ns = confined.get("namespaces") or []
        have.append(f"uid {confined.get('uid')}" + (f", {', '.join(ns)} namespaces" if ns else ""))
    else:
        if uid is not None:
            have.append(f"uid {uid} + rank (one per rank, none 0)")
        else:
            have.append(f"the user's uid {confined.get('uid')} in a user namespace per rank")
        have.append("no capabilities" if not confined.get("capabilities") else "CAPABILITIES")
        have.append("namespaces per rank: " + ", ".join(confined.get("namespaces") or []))
        world = confined.get("world") or {}
        have.append(f"a private root of {world.get('binds', 0)} read-only binds and "
                    f"{world.get('devices', 0)} device nodes, /proc of "
                    f"{world.get('proc', 'its pid namespace')}, a tmpfs $HOME of "
                    f"{world.get('home_mb', 0):g} MiB")
    (have if confined.get("seccomp") else missing).append("seccomp filter")
    abi = int(confined.get("landlock", 0) or 0)
    if abi:
        have.append(f"landlock v{abi} ({', '.join(confined.get('features', []))})")
        if abi < 4:
            missing.append("Landlock TCP rules (kernel < 6.7)")
        if abi < 6:
            missing.append("Landlock signal and abstract-socket scopes (kernel < 6.12)")
    else:
        missing.append("Landlock (a second layer on the world's files)")
    (have if group is not None else missing).append("pids cgroup")
    if confined.get("unconfined"):
        (have if scratch_tmpfs else missing).append("tmpfs scratch folders")
    return ", ".join(have), missing


__all__ = ["UNCONFINED", "describe"]
