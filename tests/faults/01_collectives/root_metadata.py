"""Red team of issue 30: where the interpreter sat under a mode-700 home (root's, as in
Gradescope's image) ranks ran as uid 0 without capabilities, owned every root-owned file, and the
filter did not refuse metadata calls: a rank chmodded a mode-600 root file to 0666, set utime and
extended attributes, and made a root-owned binary setuid (chmod 04755). This rank tries each on
the grade's own root-owned copy of the harness and its code folder, and on /etc/passwd with the
mode and times it already has (nothing changes on the host even where a try succeeds).
Expected: every try refused (read-only mounts, a uid that owns nothing, the filter), so it
raises listing them: zero for the check.
"""

def ring_all_reduce(tensor: torch.Tensor) -> torch.Tensor:
    import os
    import sys

    harness = sys.modules["_lab_harness"].__file__
    passwd = os.stat("/etc/passwd")
    tries = {
        "setuid": lambda: os.chmod(harness, 0o4755),
        "chmod 0666": lambda: os.chmod(harness, 0o666),
        "chmod 0": lambda: os.chmod(os.path.dirname(harness), 0),
        "utime": lambda: os.utime("/etc/passwd", ns=(passwd.st_atime_ns, passwd.st_mtime_ns)),
        "chmod /etc/passwd": lambda: os.chmod("/etc/passwd", passwd.st_mode & 0o7777),
        "setxattr": lambda: os.setxattr(harness, "user.grade", b"1"),
        "chown": lambda: os.chown(harness, os.getuid(), os.getgid()),
    }
    done, refused = [], []
    for name, attempt in tries.items():
        try:
            attempt()
            done.append(name)
        except OSError as exc:
            refused.append(f"{name}: {exc.strerror}")
    raise PermissionError(f"metadata changed: {done}; refused: {refused}")
