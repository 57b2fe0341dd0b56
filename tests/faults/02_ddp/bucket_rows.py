# Red-team pass 3 (lab02_bucket_rows): the harness's CALLS is a module global the submission can
# change; this one returns no row for assign_buckets. The judge expects one row per (sizes, cap)
# of the case (grader side), so no rows fail the check whatever assign_buckets does.
import _lab_harness  # noqa: E402  (the harness module the rank loaded before this file)

_lab_harness.CALLS["buckets"] = lambda student, call: []
