"""Red team of issue 30: every grade shared the host's mount namespace, so a rank's
/proc/self/mountinfo listed every other grade's /tmp/grade-*/launch-N tmpfs, and a rank that ran
as uid 0 chmodded that grade's code/*.py to 0 (a concurrent grade of the reference then scored
0/100, blamed on itself as a sandbox_violation). This rank looks for other grades for four
seconds, in its mountinfo and in the folders above its own, and tries to make every student
file it finds unreadable. Expected: it finds no other grade (its world holds its own grade's
code folder and its own $HOME, nothing else), and raises saying so.
"""

def ring_all_reduce(tensor: torch.Tensor) -> torch.Tensor:
    import glob
    import os
    import time

    home = os.environ["HOME"]
    grade = os.path.dirname(os.path.dirname(home))  # .../grade-XXXX/launch-N/rK
    seen, changed, end = set(), [], time.monotonic() + 4.0
    while time.monotonic() < end:
        for line in open("/proc/self/mountinfo"):
            point = line.split()[4]
            if "grade-" in point and not point.startswith(grade + "/"):
                seen.add(point)
        for folder in (os.path.dirname(grade), "/tmp"):
            try:
                seen.update(os.path.join(folder, name) for name in os.listdir(folder)
                            if name.startswith("grade-") and os.path.join(folder, name) != grade)
            except OSError:
                pass
        time.sleep(0.2)
    for place in sorted(seen):
        top = place.split("/launch-")[0]
        for path in glob.glob(os.path.join(top, "code", "*.py")):
            try:
                os.chmod(path, 0)
                changed.append(path)
            except OSError:
                pass
    raise RuntimeError(f"other grades seen: {sorted(seen)}; changed: {changed}")
