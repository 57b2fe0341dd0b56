"""spawn's bad input: each gets a clear error before any process starts."""

from __future__ import annotations

import threading

import pytest

from toolkit.launch import gpu_count, spawn
from toolkit.launch.context import resolve_backend


def ok(rank, world_size, *args):
    return rank


@pytest.mark.parametrize("world_size,error", [(0, ValueError), (-2, ValueError), (2.5, TypeError),
                                              (True, TypeError), ("4", TypeError)])
def test_bad_world_size(world_size, error):
    with pytest.raises(error, match="world_size"):
        spawn(ok, world_size)


def test_not_a_function():
    with pytest.raises(TypeError, match="needs a function fn\\(rank, world_size"):
        spawn(3, 2)


def test_function_that_cannot_take_rank_and_world_size():
    def no_args():
        return 1

    with pytest.raises(TypeError, match="with 2 positional arguments"):
        spawn(no_args, 2)
    def two(rank, world_size):
        return rank

    with pytest.raises(TypeError, match="with 3 positional arguments"):
        spawn(two, 2, "extra")


def test_unknown_backend_lists_the_choices():
    with pytest.raises(ValueError, match="'auto', 'gloo', 'nccl'"):
        spawn(ok, 2, backend="mpi-ish")


@pytest.mark.skipif(gpu_count() > 0,
                    reason="checks the message on a machine without GPUs")
def test_nccl_without_gpus_says_what_to_use_instead():
    with pytest.raises(ValueError, match="needs one GPU per rank.*backend='gloo'"):
        spawn(ok, 2, backend="nccl")


def test_auto_is_gloo_without_enough_gpus():
    assert resolve_backend("auto", 10_000) == "gloo"


@pytest.mark.parametrize("kwargs,match", [
    ({"timeout": 0}, "timeout"), ({"timeout": -1}, "timeout"), ({"timeout": "60"}, "timeout"),
    ({"start_method": "forkserver"}, "start_method"), ({"threads": 0}, "threads"),
    ({"seed": 1.5}, "seed"), ({"env": {"A": 1}}, "env"),
])
def test_bad_options(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        spawn(ok, 2, **kwargs)


def test_arguments_that_cannot_be_pickled_for_fresh_interpreters():
    with pytest.raises(TypeError, match="pickling.*start_method='fork'"):
        spawn(ok, 1, threading.Lock(), start_method="spawn")
