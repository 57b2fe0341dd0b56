"""The course's grader: runs a submission's code on several ranks in a sandbox, checks results
and communication (through `toolkit.comm`), and writes a Gradescope ``results.json``.

`cli` (the `autograder` command), `lab` (what a lab is: checks, cases, verdicts), `grade` (one
submission), `runner` (the sandboxed run and its watchdog), `sandbox/` (limits, Landlock,
cgroup, supervisor, in-rank harness), `failures` (named failure kinds), `feedback` (messages
that name the usual mistakes), `report` (results.json and the text report), `release` (student
editions), `batch`, `gradescope`. How it fits together and what it stops: docs/grading.md.
"""
