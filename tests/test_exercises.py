"""toolkit.exercises: sealed answers, rank-function attempts, and the STUB convention of release."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from autograder.release import strip_solutions
from toolkit import exercises


def test_a_sealed_value_matches_itself_and_its_neighbours_only():
    key = exercises.seal(0.123456)
    assert exercises.matches(0.123456, key)
    assert exercises.matches(0.12346, key)          # the same to 4 significant digits
    assert not exercises.matches(0.1236, key)
    assert not exercises.matches(-0.123456, key)
    assert "0.123" not in key


def test_ints_floats_words_and_tuples_have_one_canonical_form():
    assert exercises.matches(3.0, exercises.seal(3))
    assert exercises.matches(1000.0, exercises.seal(1e3))
    assert exercises.matches("  Cuda:1 ", exercises.seal("cuda:1"))
    assert exercises.matches((24, 0.5), exercises.seal((24, 0.5)))
    assert not exercises.matches((24, 0.5), exercises.seal((0.5, 24)))
    assert exercises.matches(torch.tensor(7), exercises.seal(7))


def test_a_value_at_a_rounding_boundary_still_matches():
    # 0.12345 rounds to 0.1235 or 0.1234 depending on its last binary digit.
    assert exercises.matches(0.12345, exercises.seal(0.123450001))
    assert exercises.matches(0.123449999, exercises.seal(0.12345))


def test_check_value_says_fill_in_correct_or_raises_the_hint(capsys):
    key = exercises.seal(0.8)
    assert exercises.check_value(1, None, key, hint="h") is False
    assert "fill in" in capsys.readouterr().out
    assert exercises.check_value(1, (None, 2), key, hint="h") is False
    assert exercises.check_value(1, 0.8, key, hint="h") is True
    out = capsys.readouterr().out
    assert "correct" in out and "0.8" not in out
    with pytest.raises(AssertionError, match="Hint: think") as info:
        exercises.check_value(1, 0.7, key, hint="think")
    assert "0.8" not in str(info.value)


def test_an_unsupported_answer_type_is_named():
    with pytest.raises(TypeError, match="dict"):
        exercises.seal({"a": 1})
    assert exercises.matches({"a": 1}, exercises.seal(1)) is False


def _stub(rank, world_size):
    raise NotImplementedError("your code here")


def _sum_ranks(rank, world_size):
    t = torch.tensor([float(rank)])
    dist.all_reduce(t)
    return t.item()


def _broken(rank, world_size):
    raise ValueError("not a stub")


@pytest.mark.multirank
def test_attempt_runs_recorded_ranks_and_knows_the_stub(capsys):
    assert exercises.attempt(2, _stub, 2, timeout=60) is None
    assert "fill in `_stub`" in capsys.readouterr().out
    results, trace = exercises.attempt(2, _sum_ranks, 2, timeout=60)
    assert results == [1.0, 1.0]
    assert trace.where(rank=0).op_counts()["all_reduce"] == 1
    with pytest.raises(Exception, match="not a stub"):
        exercises.attempt(2, _broken, 2, timeout=60)


def test_attempt_local_and_require(capsys):
    assert exercises.attempt_local(3, _stub, 0, 1) is None
    assert exercises.attempt_local(3, lambda a: a + 1, 1) == 2
    exercises.require(3, True, "fine", hint="h")
    with pytest.raises(AssertionError, match="rank 1 .*Hint: h"):
        exercises.require(3, False, "rank 1 differs", hint="h")
    exercises.correct(3, "checked on 2 ranks")
    assert "Exercise 3: correct, checked on 2 ranks" in capsys.readouterr().out


def test_release_replaces_a_region_by_its_stub_lines_keeping_indents():
    source = (
        "x = 1\n"
        "### BEGIN SOLUTION\n"
        "answer_lr = 0.8\n"
        "### END SOLUTION\n"
        "### STUB: answer_lr = None   # a float\n"
        "### HINT: what did the batch do?\n"
        "def f(a):\n"
        "    ### BEGIN SOLUTION\n"
        "    return a * 2\n"
        "    ### END SOLUTION\n"
        "    ### HINT: double it\n"
        "print(x)\n"
    )
    text, regions = strip_solutions(source)
    assert regions == 2
    assert "0.8" not in text and "a * 2" not in text
    assert "# Hint: what did the batch do?\nanswer_lr = None   # a float\n" in text
    assert "    # Hint: double it\n    raise NotImplementedError" in text
    multi = ("### BEGIN SOLUTION\ndef g():\n    return 1\n### END SOLUTION\n"
             "### STUB: def g():\n### STUB:     raise NotImplementedError\n")
    text, _ = strip_solutions(multi)
    assert text == "def g():\n    raise NotImplementedError\n"
