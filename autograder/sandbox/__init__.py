"""Running untrusted multi-rank code: the fork server, the ranks, the courier between them.

Grader side (trusted): `session` (a grade's launches within its budget), `launch` (one launch:
the loop over channels, output and the watchdog), `server` (the handle on the fork server),
`courier` and `courier_frames` (the broker every byte between ranks passes through, and what it
accepts), `reduce` (the collectives it computes), `watchdog` (a launch's processes), `scratch`
and `files` (the ranks' folders, looked at without following anything), `cgroup`.

Rank side (forked by `zygote`, confined by `confine` before any student code): `paths`,
`landlock`, `namespaces`, `seccomp`, `limits` (what is closed and how), `rank` (the case loop),
`backend` (the ranks' only process group: frames to the courier), `probe` (what a lab's harness
gets), `channel` (frames and tensors as plain data, both sides).
"""
