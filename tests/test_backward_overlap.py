"""toolkit.experiments.backward_overlap on 2 gloo ranks: lesson 06's exercise 5 judged from what
ranks return, what the recorder saw and the profiler's trace. A right answer passes every
question; the blocking all-reduce, hooks left registered, and an all-reduce without the mean each
fail the question they should, and only it; the stub is recognised by the student's name."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from toolkit import exercises
from toolkit.experiments.backward_overlap import check, on_ranks
from toolkit.experiments.profiling import warm_profiler
from toolkit.viz.overlap import symptoms
from toolkit.viz.trace import merge_traces, read_trace

TIMEOUT = 60


@pytest.fixture(scope="module", autouse=True)
def warm():
    warm_profiler()


def overlapped(loss, params):
    handles = []
    hooks = [p.register_post_accumulate_grad_hook(
        lambda p: handles.append((p, dist.all_reduce(p.grad, async_op=True)))) for p in params]
    loss.backward()
    for h in hooks:
        h.remove()
    for p, work in handles:
        work.wait()
        p.grad /= dist.get_world_size()


def bucketed_by_two(loss, params):  # fewer, larger all-reduces: as right as one per tensor
    handles, ready = [], []

    def hook(p):
        ready.append(p)
        if len(ready) == 2:
            flat = torch.cat([q.grad.flatten() for q in ready])
            handles.append((list(ready), flat, dist.all_reduce(flat, async_op=True)))
            ready.clear()
    hooks = [p.register_post_accumulate_grad_hook(hook) for p in params]
    loss.backward()
    for h in hooks:
        h.remove()
    for group, flat, work in handles:
        work.wait()
        at = 0
        for q in group:
            q.grad.copy_(flat[at:at + q.numel()].view_as(q.grad) / dist.get_world_size())
            at += q.numel()


def blocking(loss, params):
    loss.backward()
    for p in params:
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()


def leaves_its_hooks(loss, params):
    handles = []
    for p in params:
        p.register_post_accumulate_grad_hook(
            lambda p: handles.append((p, dist.all_reduce(p.grad, async_op=True))))
    loss.backward()
    for p, work in handles:
        work.wait()
        p.grad /= dist.get_world_size()


def sums_without_mean(loss, params):
    handles = []
    hooks = [p.register_post_accumulate_grad_hook(
        lambda p: handles.append(dist.all_reduce(p.grad, async_op=True))) for p in params]
    loss.backward()
    for h in hooks:
        h.remove()
    for work in handles:
        work.wait()


def judged(fn, tmp_path):
    results, recorded = exercises.attempt(5, on_ranks(fn, folder=tmp_path), 2, timeout=TIMEOUT)
    spans = merge_traces([read_trace(r["path"]) for r in results])
    return check(results, recorded, [symptoms(spans, rank=r)["early_launches"] for r in (0, 1)])


def failed(verdicts):
    """Which of the three questions failed on some rank."""
    return sorted({question for question, ok, _ in verdicts if not ok})


@pytest.mark.parametrize("fn, wrong", [(overlapped, []), (bucketed_by_two, []),
                                       (blocking, ["overlap"]),
                                       (leaves_its_hooks, ["bytes", "values"]),
                                       (sums_without_mean, ["values"])],
                         ids=lambda v: getattr(v, "__name__", str(v)))
def test_each_answer_fails_exactly_the_questions_it_should(tmp_path, fn, wrong):
    verdicts = judged(fn, tmp_path)
    assert len(verdicts) == 6 and failed(verdicts) == wrong, verdicts
    assert [q for q, _, _ in verdicts] == ["values", "bytes", "overlap"] * 2
    assert all("def " not in msg and "register" not in msg for _, _, msg in verdicts)


def test_the_stub_is_asked_for_by_its_own_name(tmp_path, capsys):
    def overlapped_backward(loss, params):
        raise NotImplementedError("Exercise 5")
    assert exercises.attempt(5, on_ranks(overlapped_backward, folder=tmp_path), 2,
                             timeout=TIMEOUT) is None
    assert "fill in `overlapped_backward`" in capsys.readouterr().out


def test_on_ranks_needs_an_existing_folder(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        on_ranks(overlapped, folder=tmp_path / "missing")
