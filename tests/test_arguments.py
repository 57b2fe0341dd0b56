"""toolkit.arguments: the one place argument checks are written; each error names the
function, the argument, what was expected and what arrived."""

from __future__ import annotations

import numpy as np
import pytest

from toolkit.arguments import check_int, check_ints, check_positive, check_positives


def test_check_int_returns_good_values_and_names_everything_in_its_error():
    assert check_int("f", "n", 3) == 3 and check_int("f", "n", np.int64(2)) == 2
    assert check_int("f", "k", 0, low=0) == 0
    with pytest.raises(ValueError, match=r"^assign_layers: p must be an int >= 1, got 0$"):
        check_int("assign_layers", "p", 0)
    with pytest.raises(ValueError, match=r"^f: n \(number of blocks\) must be an int >= 1, "
                                         r"got True$"):
        check_int("f", "n", True, hint="number of blocks")         # a flag is not a count
    with pytest.raises(ValueError, match=r"^f: m must be an int in 1 … 16, got 17$"):
        check_int("f", "m", 17, high=16)
    with pytest.raises(ValueError, match=r"^seq_len must be an int >= 1, got 2.5$"):
        check_int("", "seq_len", 2.5)
    with pytest.raises(ValueError, match=r"^L: size must be a positive int, got '4'$"):
        check_int("L", "size", "4", expected="a positive int")


def test_several_at_once_stop_at_the_first_bad_one_in_order():
    check_ints("Layout", dp=1, tp=2)
    with pytest.raises(ValueError, match=r"^Layout: tp must be an int >= 1, got -1$"):
        check_ints("Layout", dp=1, tp=-1, pp=0)


def test_check_positive_takes_ints_and_floats_but_not_bools_or_zero():
    assert check_positive("C", "peak_flops", 1e12) == 1e12 and check_positive("C", "n", 3) == 3
    for bad in (0, -1.0, True, "1", None):
        with pytest.raises(ValueError, match=r"^C: peak_flops must be a number > 0, got "):
            check_positive("C", "peak_flops", bad)
    with pytest.raises(ValueError, match=r"^bucket_cap_mb \(MiB\) must be a number > 0, got 0$"):
        check_positive("", "bucket_cap_mb", 0, hint="MiB")
    with pytest.raises(ValueError, match=r"^f: lr must be a number > 0"):
        check_positives("f", seconds=1.0, lr=0.0)
