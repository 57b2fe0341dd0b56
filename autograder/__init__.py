"""The course's grader: runs a submission's code on several ranks in a sandbox, checks results
and communication (through `toolkit.comm`), and writes a Gradescope ``results.json``.

Empty until the autograder issue lands; the package exists so the distribution's layout and
import names are fixed from the start (see docs/architecture.md).
"""
