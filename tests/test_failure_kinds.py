"""A NotImplementedError is "still the stub" only when the student's own ``raise
NotImplementedError`` line raised it (red team 3: torch's own, e.g. for a meta tensor, was
reported as "Not written yet"); the line is read from the grader's copy of the file, never
from the rank's traceback text."""

from __future__ import annotations

import pytest

from autograder.failures import classify_end
from autograder.protocol import RankEnd

SOURCE = ("import torch\n"
          "def stub():\n"
          "    raise NotImplementedError(\"your code here\")\n"
          "def written(t):\n"
          "    return t.numpy()\n")
STUB = ('Traceback (most recent call last):\n'
        '  File "/sandbox/_lab_harness.py", line 9, in _call\n'
        '  File "/sandbox/code/sol.py", line 3, in stub\n')
TORCH = ('Traceback (most recent call last):\n'
         '  File "/sandbox/code/sol.py", line 5, in written\n'
         '  File "/venv/torch/_tensor.py", line 1200, in numpy\n')
IN_LINE = ('Traceback (most recent call last):\n'
           '  File "/sandbox/code/sol.py", line 5, in written\n')
OTHER_FILE = ('Traceback (most recent call last):\n'
              '  File "/sandbox/code/not_sol.py", line 3, in stub\n')


@pytest.mark.parametrize("tb, kind", [(STUB, "not_implemented"), (TORCH, "exception"),
                                      (IN_LINE, "exception"), (OTHER_FILE, "exception"),
                                      ("", "exception")])
def test_only_the_stubs_own_raise_is_not_implemented(tb, kind):
    end = RankEnd(rank=1, how="error", exc_type="NotImplementedError",
                  message="Cannot copy out of meta tensor; no data!", traceback=tb)
    got, message = classify_end(end, "sol", sources={"sol.py": SOURCE})
    assert got == kind, message
    if kind == "not_implemented":
        assert message == ("Not written yet: sol.py line 3 (in stub: `raise "
                           "NotImplementedError(\"your code here\")`) still raises "
                           "NotImplementedError.")
    else:
        assert message.startswith("Rank 1 raised NotImplementedError: Cannot copy out of meta")


def test_without_the_grader_copy_of_the_file_it_is_an_exception():
    end = RankEnd(rank=0, how="error", exc_type="NotImplementedError", traceback=STUB)
    assert classify_end(end, "sol", sources=None)[0] == "exception"
