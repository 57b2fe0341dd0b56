"""Static device check (tests/device_lint.py): every tensor factory on the rank side says where
its tensor goes, except the few host tensors in the allow-list, each with its reason."""

from __future__ import annotations

import ast
import textwrap

import device_lint as lint


def _findings(src: str) -> list[tuple[str, str]]:
    return [(f.function, f.factory) for f in lint._scan(ast.parse(textwrap.dedent(src)), "x.py")]


def test_the_check_flags_unplaced_factories_and_accepts_placed_ones():
    src = """
        import torch
        def bad(x):
            a = torch.zeros(3)
            b = torch.tensor([1.0], device="cpu")          # host on purpose: must be allowed
            c = torch.empty(2, device=torch.device("cpu"))
            return a, b, c
        class Layer:
            def __init__(self, n, device=None):
                self.w = torch.empty(n, n)
        def good(x, n):
            return (torch.zeros(n, device=x.device), torch.zeros_like(x), x.new_empty(n),
                    torch.arange(n, device="meta"), torch.cat([x, x]))
    """
    assert _findings(src) == [("bad", "zeros"), ("bad", "tensor"), ("bad", "empty"),
                              ("Layer.__init__", "empty")]


def test_notebook_rank_functions_and_their_helpers_are_found(tmp_path):
    nb = tmp_path / "nb.ipynb"
    cells = [
        "import torch\nHOST = torch.zeros(3)  # host side: not a rank function",
        "def helper(n):\n    return torch.ones(n)\n\ndef plot(t):\n    return torch.ones(2)",
        "%time x = 1\ndef work(rank, world_size):\n    return helper(4) + rank",
    ]
    nb.write_text('{"cells": [' + ",".join(
        '{"cell_type": "code", "source": %s}' % repr(c).replace("'", '"') for c in cells)
        + '], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}')
    names = sorted(fn.name for fn in lint.rank_functions(nb))
    assert names == ["helper", "work"]  # plot is never called by a rank function


def test_rank_side_code_creates_tensors_on_the_device_of_its_data():
    found = lint.all_findings()
    left = [f for f in found if (f.path.split(" ")[0], f.function) not in lint.ALLOWED]
    assert not left, "tensors made without a device on the rank side:\n" + "\n".join(map(str, left))


def test_every_allow_list_entry_is_still_needed_and_explained():
    used = {(f.path.split(" ")[0], f.function) for f in lint.all_findings()}
    stale = sorted(set(lint.ALLOWED) - used)
    assert not stale, f"allow-list entries that match nothing any more (remove them): {stale}"
    assert all(len(why) > 40 for why in lint.ALLOWED.values())
    # 13: the offload tiers' host_tensor (host memory is what an offload store is) joined the
    # 12 entries main had.
    assert len(lint.ALLOWED) <= 13, "the allow-list is for a few host tensors, not a way out"


def test_the_rank_side_files_cover_toolkit_labs_and_notebooks():
    modules, notebooks = lint.rank_side_files()
    names = {p.relative_to(lint.ROOT).as_posix() for p in modules}
    assert {"toolkit/data_parallel/zero.py", "toolkit/data_parallel/fsdp.py",
            "toolkit/collectives/ring.py", "toolkit/pipeline/executor.py",
            "labs/01_collectives/collectives.py", "labs/03_sharded_optimizer/harness.py"} <= names
    assert not any(n.endswith(lint.GRADER_SIDE) or "/viz/" in n for n in names)
    assert {p.name for p in notebooks} >= {"00_getting_started.ipynb", "playground.ipynb"}
    assert sum(len(lint.rank_functions(p)) for p in notebooks) > 30
