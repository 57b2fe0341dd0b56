# Red-team pass 3 (lab03_bounds_rows): the harness's CALLS["bounds"] replaced so that it returns
# no row. The judge expects one row per (n, p) of the case (grader side): no rows fail.
import _lab_harness  # noqa: E402  (the harness module the rank loaded before this file)

_lab_harness.CALLS["bounds"] = lambda student, call: []
