"""Running untrusted multi-rank code: limits, Landlock, the supervisor and the in-rank harness.

`limits` (rlimits, uid, what the sandbox may read and write), `cgroup` (a pids cgroup where the
host allows one), `landlock` (file-system confinement), `supervisor` (the sandbox's main
process), `harness` (what runs in each rank). The grader side is `autograder.runner`.
"""
