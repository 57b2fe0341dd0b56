"""The course's grader: runs a submission's code on several ranks in a sandbox, checks results
and communication (every byte between ranks passes through the grader's courier), and writes a
Gradescope ``results.json``.

`cli` (the `autograder` command), `lab` (what a lab is: checks, cases), `protocol` (the typed
seam: ops, traffic, records, verdicts), `grade` (one submission: plan, run, judge), `judging`
(records to scores), `sandbox/` (fork server, confinement, courier, watchdog), `failures` and
`hangs` (named failure kinds), `sanitize` (rank text made printable), `feedback` (messages
that name the usual mistakes), `report` (results.json and the text report), `release` (student
editions), `batch`, `gradescope`. How it fits together and what it stops: docs/grading.md.
"""
