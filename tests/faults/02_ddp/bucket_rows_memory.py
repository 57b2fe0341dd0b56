# Red-team pass 3 (lab02_bucket_rows_memory): one returned row naming its own sizes (three
# parameters of 10**12 elements). The judge used to build torch.zeros(n) for each: 12 TB asked
# of the grader from a few bytes of output. It now reads only the row's buckets and takes the
# sizes from the case, so the row count is wrong and nothing is allocated.
import _lab_harness  # noqa: E402

_lab_harness.CALLS["buckets"] = lambda student, call: [
    {"sizes": [10**12] * 3, "cap": 1, "buckets": [[2], [1], [0]]}]
