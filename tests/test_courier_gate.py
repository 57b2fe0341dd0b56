"""The gate (issue 19 §2), without ranks: the scale schedule (`autograder.sandbox.gate`), the
courier's answers to ``gate`` frames (fed by hand, as in test_courier), where the grader puts
each case's key, a `Call` without a channel, and lab 02's `Gate` function and reference."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from test_courier import courier, op, replies

from autograder.grade import plan
from autograder.lab import load_lab
from autograder.protocol import CaseKey, Gate
from autograder.sandbox import courier as cm
from autograder.sandbox.channel import HEADER, MAX_META, FrameError, FrameReader, encode_frame
from autograder.sandbox.courier_frames import handle
from autograder.sandbox.gate import LOCAL_KEY, case_key, scale
from autograder.sandbox.probe import Call

LAB = load_lab(Path(__file__).resolve().parents[1] / "labs" / "02_ddp")
import _lab_harness as harness  # noqa: E402  (registered by load_lab)

checks = next(c for c in LAB.checks if c.call == "train").judge.__globals__  # checks.py's names


def test_scales_are_exact_above_one_and_fixed_by_key_and_index():
    key = case_key(2**63 + 5, 3, 1)
    got = [scale(key, n) for n in range(200)]
    assert got == [scale(key, n) for n in range(200)]             # deterministic
    assert all(64 * (s - 1) in range(1, 33) for s in got)          # 1 + k/64, k in 1..32
    for s in got:
        for dtype in (torch.float32, torch.bfloat16):
            assert torch.tensor(s, dtype=dtype).item() == s        # exact in float32, bf16
    assert len(set(got)) > 16                                     # not a constant
    other = [scale(case_key(2**63 + 6, 3, 1), n) for n in range(200)]
    assert other != got and [scale(LOCAL_KEY, n) for n in range(200)] != got


def test_case_keys_differ_by_secret_check_and_case_and_refuse_bad_arguments():
    keys = {case_key(s, c, i) for s in (0, 1, 2**64 - 1) for c in (0, 1) for i in (0, 1)}
    assert len(keys) == 12 and all(len(k) == 32 for k in keys)
    with pytest.raises(ValueError, match="secret must be an integer >= 0"):
        case_key(-1, 0, 0)
    with pytest.raises(ValueError, match="n must be an integer >= 0"):
        scale("k", -1)
    with pytest.raises(ValueError, match="key must be non-empty text"):
        scale("", 0)


def test_the_courier_answers_each_ranks_nth_gate_and_records_where_it_was_read():
    c = courier(2, frozenset({"all_reduce"}), cases=2)
    c.plan[0].gate = "k0"
    op(c, 0, 0, "all_reduce", [torch.ones(2)], [torch.ones(2)], reduce="sum")
    handle(c, 0, {"k": "gate"}, b"")
    handle(c, 0, {"k": "gate", "extra": "ignored"}, b"")
    handle(c, 1, {"k": "gate"}, b"")
    assert c.failure is None
    answers = [m for m, _ in replies(c, 0) if m["k"] == "gate"]
    assert answers == [{"k": "gate", "n": 0, "scale": scale("k0", 0)},
                       {"k": "gate", "n": 1, "scale": scale("k0", 1)}]
    assert [m for m, _ in replies(c, 1) if m["k"] == "gate"] == [
        {"k": "gate", "n": 0, "scale": scale("k0", 0)}]          # n counts per rank, not rank
    t = c.traffic_of(0)
    assert [type(e).__name__ for e in t.entries] == ["Op", "Gate", "Gate"]
    assert [(g.n, g.scale) for g in t.gates] == [(0, scale("k0", 0)), (1, scale("k0", 1))]
    assert t.position(t.gates[0]) == 1 and t.marks == [] and t.section("x").gates == []
    handle(c, 0, {"k": "output", "case": 0, "tree": None}, b"")  # rank 0 moves to case 1
    handle(c, 0, {"k": "gate"}, b"")                             # its key is empty: LOCAL_KEY
    assert [m for m, _ in replies(c, 0) if m["k"] == "gate"] == [
        {"k": "gate", "n": 0, "scale": scale(LOCAL_KEY, 0)}]


def test_a_mark_cannot_pass_for_a_gate():
    c = courier(2)
    handle(c, 0, {"k": "mark", "label": "gate0"}, b"")
    handle(c, 0, {"k": "mark", "label": str(Gate(0, 1.5))}, b"")
    assert c.traffic_of(0).gates == [] and len(c.traffic_of(0).marks) == 2


@pytest.mark.parametrize("meta, payload, why", [
    ({"k": "gate"}, b"\x00" * 8, "a gate with a payload"),
    ({"k": "gates"}, b"", "unknown frame"),
])
def test_forged_gate_frames_are_tampering(meta, payload, why):
    c = courier(2)
    handle(c, 1, meta, payload)
    assert c.failure.kind == "tampering" and c.failure.rank == 1 and why in c.failure.message


def test_an_oversized_gate_frame_is_refused_before_it_is_read():
    """The launch turns a FrameError into tampering (launch.py) before any kind is looked at."""
    raw = encode_frame({"k": "gate"})
    reader = FrameReader()
    reader.feed(HEADER.pack(MAX_META + 1, 0) + raw[HEADER.size:])
    with pytest.raises(FrameError, match="over the caps"):
        reader.frames()
    with pytest.raises(FrameError, match="frame too large"):
        encode_frame({"k": "gate", "pad": "x" * MAX_META})


def test_a_gate_outside_a_case_is_tampering():
    c = courier(2)
    handle(c, 0, {"k": "output", "case": 0, "tree": None}, b"")  # its only case is over
    handle(c, 0, {"k": "gate"}, b"")
    assert c.failure.kind == "tampering" and "a gate outside a case" in c.failure.message


def test_gates_count_against_the_call_limit(monkeypatch):
    monkeypatch.setattr(cm, "MAX_CALLS", 10)
    c = courier(2)
    for _ in range(10):
        handle(c, 0, {"k": "gate"}, b"")
    assert c.failure is None and len(c.traffic_of(0).gates) == 10
    handle(c, 0, {"k": "gate"}, b"")
    assert c.failure.kind == "call_limit" and len(c.traffic_of(0).gates) == 10
    assert len([m for m, _ in replies(c, 0) if m["k"] == "gate"]) == 10


def test_the_grader_gives_every_case_a_key_the_ranks_never_see():
    launches, cases = plan(LAB, 12345)
    seen = set()
    for launch in launches:
        for case in launch.cases:
            full = cases[CaseKey(launch.key.check, case.index)].case
            assert case.gate == full["gate_key"] == case_key(12345, launch.key.check, case.index)
            assert "gate_key" not in case.params and "seed" not in case.params
            seen.add(case.gate)
    assert len(seen) == sum(len(c.cases) for c in LAB.checks)


def test_a_call_without_a_channel_answers_the_public_schedule():
    call = Call(0, 1, {}, None)
    assert [call.gate() for _ in range(3)] == [scale(LOCAL_KEY, n) for n in range(3)]


def test_the_gate_scales_the_first_layers_gradients_only():
    case = {"seed": 4, "model": "toy", "tied": True}
    x, y = harness.make_data(case)
    grads = []
    for s in (None, 1.375):
        model = harness.make_model(case)
        if s is not None:
            harness.install_gate(model, lambda s=s: s)
        F.mse_loss(model(x), y).backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    plain, gated = grads
    for name in plain:
        want = plain[name] * 1.375 if name.startswith("a.") else plain[name]
        assert torch.allclose(gated[name], want, rtol=1e-6, atol=1e-7), name
    assert not torch.allclose(gated["a.weight"], plain["a.weight"])


def test_the_reference_follows_the_cases_key():
    case = {"world_size": 2, "seed": 3, "model": "mlp", "steps": 2, "accumulate": 2}
    a, b = (checks["reference"](dict(case, gate_key=key)) for key in ("aa", "bb"))
    assert not torch.allclose(a["layers.0.weight"], b["layers.0.weight"], rtol=1e-4, atol=2e-5)
    local = checks["reference"](case)  # no key: the schedule of a Call without a channel
    assert all(torch.equal(v, checks["reference"](dict(case, gate_key=LOCAL_KEY))[k])
               for k, v in local.items())
