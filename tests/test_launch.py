"""spawn: results, arguments, context, output, seeds, and launches running at the same time."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch
import torch.distributed as dist

from toolkit.launch import context, device, spawn

pytestmark = pytest.mark.multirank


def hello(rank, world_size):
    t = torch.tensor([float(rank)])
    dist.all_reduce(t)
    return t.item()


def test_readme_example_all_reduce():
    assert spawn(hello, world_size=4, timeout=60) == [6.0, 6.0, 6.0, 6.0]


def slow_in_reverse(rank, world_size):
    time.sleep(0.1 * (world_size - rank))  # rank 0 finishes last
    return rank * 10 + 1


def test_results_come_back_in_rank_order():
    assert spawn(slow_in_reverse, 4, timeout=60) == [1, 11, 21, 31]


def echo_args(rank, world_size, word, mapping, *, _unused=None):
    return (rank, world_size, word, mapping)


def test_extra_arguments_reach_every_rank():
    out = spawn(echo_args, 3, "hi", {"k": [1, 2]}, timeout=60)
    assert out == [(r, 3, "hi", {"k": [1, 2]}) for r in range(3)]


def single(rank, world_size):
    return dist.get_world_size(), dist.get_rank()


def test_world_size_one_has_a_process_group():
    assert spawn(single, 1, timeout=60) == [(1, 0)]


def who(rank, world_size):
    ctx = context()
    return {"rank": ctx.rank, "world": ctx.world_size, "local_rank": ctx.local_rank,
            "backend": ctx.backend, "device": str(device()), "dist_rank": dist.get_rank(),
            "env": (os.environ["RANK"], os.environ["WORLD_SIZE"], os.environ["LOCAL_RANK"]),
            "pid": os.getpid(), "threads": torch.get_num_threads()}


def test_context_and_environment_inside_ranks():
    out = spawn(who, 2, timeout=60)
    for r, info in enumerate(out):
        assert info["rank"] == info["dist_rank"] == info["local_rank"] == r
        assert info["world"] == 2
        assert info["backend"] == "gloo" and info["device"] == "cpu"
        assert info["env"] == (str(r), "2", str(r))
        assert info["threads"] == 1  # forked ranks run one intra-op thread each
    assert out[0]["pid"] != out[1]["pid"] != os.getpid()


def test_context_outside_a_rank_says_how_to_get_one():
    with pytest.raises(RuntimeError, match="spawn"):
        context()


def draw(rank, world_size):
    return torch.rand(3).tolist()


def test_seed_gives_each_rank_its_own_reproducible_stream():
    a = spawn(draw, 2, timeout=60)
    b = spawn(draw, 2, timeout=60)
    assert a == b                      # same seed, same numbers
    assert a[0] != a[1]                # seed + rank: ranks differ
    torch.manual_seed(0)
    assert a[0] == torch.rand(3).tolist()  # rank 0 is seeded with seed + 0
    c = spawn(draw, 2, seed=1, timeout=60)
    assert c[0] == a[1]                # seed 1 on rank 0 == seed 0 on rank 1


def test_seed_none_keeps_the_callers_generator_state():
    torch.manual_seed(1234)
    expected = torch.rand(3).tolist()
    torch.manual_seed(1234)
    out = spawn(draw, 2, seed=None, timeout=60)
    assert out == [expected, expected]  # forked ranks copy the caller's state


def talk(rank, world_size):
    print(f"hello from {rank}")
    print(f"warning from {rank}", file=sys.stderr)
    os.write(1, f"raw fd write {rank}\n".encode())  # C-level output is caught too
    return rank


def test_output_is_tagged_with_the_rank(capsys):
    spawn(talk, 2, timeout=60)
    out, err = capsys.readouterr()
    for r in range(2):
        assert f"[rank {r}] hello from {r}" in out.splitlines()
        assert f"[rank {r}] raw fd write {r}" in out.splitlines()
        assert f"[rank {r}] warning from {r}" in err.splitlines()


def test_echo_false_shows_nothing(capsys):
    spawn(talk, 2, echo=False, timeout=60)
    out, err = capsys.readouterr()
    assert "hello from" not in out and "warning from" not in err


def flood(rank, world_size):
    line = "x" * 99
    for _ in range(30_000):  # 3 MB
        print(line)
    return rank


def test_an_output_flood_is_capped(capsys):
    assert spawn(flood, 2, timeout=60) == [0, 1]
    out, _ = capsys.readouterr()
    assert len(out) < 2 * 1.2e6
    assert "more output not shown" in out


def tensors(rank, world_size):
    return {"w": torch.full((2, 2), float(rank)), "n": rank}


def test_tensors_come_back():
    out = spawn(tensors, 2, timeout=60)
    assert torch.equal(out[1]["w"], torch.ones(2, 2)) and out[1]["n"] == 1


def test_two_launches_at_once_from_threads():
    results: dict[int, list] = {}

    def run(i):
        results[i] = spawn(hello, 2, timeout=60, echo=False)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert results == {0: [1.0, 1.0], 1: [1.0, 1.0]}


SCRIPT = textwrap.dedent("""
    import sys, torch, torch.distributed as dist
    from toolkit.launch import spawn

    def work(rank, world_size, k):   # defined in __main__: plain pickling cannot find it
        t = torch.tensor([float(rank + k)])
        dist.all_reduce(t)
        return t.item()

    if __name__ == "__main__":
        print("RESULT", spawn(work, 2, 10, start_method=sys.argv[1], timeout=90))
""")


@pytest.mark.slow
def test_four_launches_at_once_from_separate_processes(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    procs = [subprocess.Popen([sys.executable, str(script), "fork"], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for _ in range(4)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out
        assert "RESULT [21.0, 21.0]" in out


@pytest.mark.slow
def test_spawn_start_method_ships_a_main_function_by_value(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    p = subprocess.run([sys.executable, str(script), "spawn"], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "RESULT [21.0, 21.0]" in p.stdout
