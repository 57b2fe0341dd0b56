"""spawn(..., trusted=False): ranks cannot make the parent run code through what they return."""

from __future__ import annotations

import os
import pickle

import pytest
import torch

from toolkit.launch import RankError, spawn
from toolkit.launch.safe_pickle import loads


class _Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_plain_data_round_trips():
    data = ("ok", {"a": [1, 2.5, None, True], "b": b"\x00\x01", "c": {1, 2}, "d": (1j,)}, [], 0)
    assert loads(pickle.dumps(data)) == data


def test_a_pickle_that_calls_a_function_is_refused():
    with pytest.raises(pickle.UnpicklingError, match="posix.system|os.system"):
        loads(pickle.dumps(_Evil()))


def _returns_tensor(rank, world_size):
    return torch.ones(2)


def _returns_plain(rank, world_size):
    return {"rank": rank, "raw": bytes([rank])}


def _raises(rank, world_size):
    raise ValueError(f"bad value on {rank}")


@pytest.mark.multirank
def test_untrusted_ranks_return_plain_data_only():
    assert spawn(_returns_plain, 2, timeout=30, echo=False, trusted=False) == [
        {"rank": 0, "raw": b"\x00"}, {"rank": 1, "raw": b"\x01"}]
    with pytest.raises(RankError) as err:
        spawn(_returns_tensor, 2, timeout=30, echo=False, trusted=False)
    assert "refused to load" in str(err.value)


@pytest.mark.multirank
def test_untrusted_exceptions_stay_text():
    with pytest.raises(RankError) as err:
        spawn(_raises, 2, timeout=30, echo=False, trusted=False)
    assert err.value.exception is None and err.value.exc_type == "ValueError"
    assert "bad value on" in err.value.traceback


def test_rank_outcomes_cross_the_pipe_as_plain_data_and_come_back_equal():
    from toolkit.comm import Event
    from toolkit.launch.outcome import RankFailure, RankOutcome

    event = Event(1, 0, "send", 0, 8, "float32", (2,), 1.0, 2.0, values=(1.0, 2.0)).as_tuple()
    outcomes = [RankOutcome.ok({"loss": 0.5}, [event], dropped=3),
                RankOutcome.error(RankFailure("exception", "ValueError", "bad", "Traceback...",
                                              b"\x80", time=12.5), [event], dropped=1),
                RankOutcome.died(-9)]
    for outcome in outcomes:
        plain = loads(pickle.dumps(outcome.to_plain()))     # classes are refused: none needed
        assert RankOutcome.from_plain(plain) == outcome
    for bad in (("ok", 1, [], 0), {"kind": "won"}, {"kind": "error", "failure": {"kind": "x"}},
                {"kind": "ok", "events": [(1, 2)]}):
        with pytest.raises(ValueError):
            RankOutcome.from_plain(bad)
