"""viz.ring_animation / viz.ring_table: a real ring all-reduce, replayed from its recording."""

from __future__ import annotations

import pytest
import torch

from toolkit import collectives as C
from toolkit import comm, viz
from toolkit.launch import spawn

pytestmark = pytest.mark.multirank
TIMEOUT = 60


def _ring(rank: int, world_size: int, n: int, algorithm: str = "ring", repeat: int = 1,
          offset: int = 0):
    """Returns (input, all-reduced) of this rank; inputs differ per rank and element. With
    `offset`, the tensor is a view that starts `offset` elements into a larger storage."""
    t = torch.zeros(offset + n)[offset:]
    t += torch.arange(n, dtype=torch.float32) * (rank + 1) + 10 * rank
    before = t.tolist()
    for _ in range(repeat):
        C.all_reduce(t, algorithm=algorithm)
    return before, t.tolist()


def _record(p: int, n: int, *, values: int = 16, **kwargs):
    with comm.recording(values=values) as trace:
        out = spawn(_ring, p, n, kwargs.get("algorithm", "ring"), kwargs.get("repeat", 1),
                    kwargs.get("offset", 0), timeout=TIMEOUT)
    return trace, [o[0] for o in out], [o[1] for o in out]


@pytest.fixture(scope="module", params=[(2, 5), (3, 7), (4, 8)],
                ids=["p2_n5", "p3_n7", "p4_n8"])
def run(request):
    p, n = request.param
    trace, initial, results = _record(p, n)
    return p, n, trace, initial, results


def test_table_replays_to_the_all_reduced_sum_on_every_rank(run):
    p, n, trace, initial, results = run
    total = [sum(col) for col in zip(*initial)]
    assert all(r == total for r in results)                     # the run itself was right
    table = viz.ring_table(trace, initial)
    assert len(table) == 2 * (p - 1) * p
    assert list(table.columns) == ["step", "phase", "src", "dst", "chunk", "sent",
                                   "buffer_after", "holds"]
    last = table[table.step == 2 * (p - 1)]
    assert sorted(last.dst) == list(range(p))
    for buf in last.buffer_after:
        assert list(buf) == pytest.approx(total)
    assert (table.dst == (table.src + 1) % p).all()
    assert set(table[table.step < p].phase) == {"reduce-scatter"}
    assert set(table[table.step >= p].phase) == {"all-gather"}
    # the chunks found from the recorded offsets follow Patarasuk & Yuan's schedule
    s = table.step - 1
    rs = table.step < p
    assert (table[rs].chunk == (table[rs].src - s[rs] - 1) % p).all()
    assert (table[~rs].chunk == (table[~rs].src - (s[~rs] - (p - 1))) % p).all()
    sizes = C.chunk_sizes(n, p)
    assert [len(v) for v in table.sent] == [sizes[c] for c in table.chunk]
    # after the reduce-scatter every chunk a rank received is summed over all ranks
    assert all(len(h) == p for h in table[table.step == p - 1].holds)


def test_animation_has_a_frame_per_step_and_an_arrow_per_link(run):
    p, n, trace, initial, results = run
    fig = viz.ring_animation(trace, initial, title="test ring")
    assert len(fig.frames) == 2 * (p - 1) + 1
    assert [f.name for f in fig.frames] == [str(k) for k in range(2 * (p - 1) + 1)]
    for k, frame in enumerate(fig.frames):
        cells, arrows, labels = frame.data
        n_arrows = list(arrows.x).count(None)
        assert n_arrows == len(labels.x) == (0 if k == 0 else p), f"frame {k}"
        assert len(cells.x) == p * p
        assert frame.layout.title.text.startswith("test ring")
    assert len(fig.layout.sliders[0].steps) == len(fig.frames)
    assert [b.label for b in fig.layout.updatemenus[0].buttons] == ["▶ play", "❚❚ pause"]
    # the first frame shows the inputs, the last one the sum, in every rank's cells
    first, last = fig.frames[0].data[0], fig.frames[-1].data[0]
    bounds = C.chunk_bounds(n, p)
    head = [f"{initial[r][bounds[c][0]]:.4g}" for r in range(p) for c in range(p)]
    assert [t.split("<br>")[0] for t in first.text] == head
    total = [sum(col) for col in zip(*initial)]
    assert [t.split("<br>")[0] for t in last.text] == [
        f"{total[bounds[c][0]]:.4g}" for _ in range(p) for c in range(p)]
    assert len(set(last.marker.color)) == 1 and len(set(first.marker.color)) == 1
    assert fig.frames[-1].data[2].text[0].startswith("c")  # "c<chunk>: values"


def test_tensors_are_accepted_as_initial(run):
    p, n, trace, initial, results = run
    as_tensors = [torch.tensor(row) for row in initial]
    assert viz.ring_table(trace, as_tensors).equals(viz.ring_table(trace, initial))


def test_a_tensor_that_is_a_view_into_a_larger_storage():
    trace, initial, results = _record(3, 7, offset=5)
    assert min(e.offset for e in trace.where(op="isend")) == 5   # offsets count from the storage
    last = viz.ring_table(trace, initial).tail(3)
    assert all(list(buf) == results[0] for buf in last.buffer_after)


def test_bad_input_says_what_to_pass():
    trace, initial, _ = _record(3, 6, values=0)
    with pytest.raises(ValueError, match=r"comm\.recording\(values=2\)"):
        viz.ring_animation(trace, initial)
    small, initial, _ = _record(3, 6, values=1)     # chunks of 2 elements: too big to keep
    with pytest.raises(ValueError, match=r"comm\.recording\(values=2\)"):
        viz.ring_table(small, initial)
    with pytest.raises(ValueError, match="no point-to-point messages"):
        viz.ring_animation(comm.Trace(), initial)

    good, initial, _ = _record(3, 6)
    with pytest.raises(ValueError, match="replaying `initial`"):
        viz.ring_animation(good, initial[::-1])                 # not in rank order
    with pytest.raises(ValueError, match="one input per rank"):
        viz.ring_animation(good, initial[:1])
    with pytest.raises(ValueError, match="not a ring of 4 ranks|sent 4 messages"):
        viz.ring_animation(good, initial + [initial[0]])        # one rank too many

    twice, initial, _ = _record(3, 6, repeat=2)
    with pytest.raises(ValueError, match=r"rank 0 sent 8 messages.*exactly one ring_all_reduce"):
        viz.ring_animation(twice, initial)

    tree, initial, _ = _record(3, 6, algorithm="tree")
    with pytest.raises(ValueError, match="not a ring"):
        viz.ring_animation(tree, initial)
    ps, initial, _ = _record(4, 8, algorithm="ps")
    with pytest.raises(ValueError, match="not a ring"):
        viz.ring_table(ps, initial)
