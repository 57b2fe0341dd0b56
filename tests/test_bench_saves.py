"""Each benchmark's --save, on a tiny size: the entry it records holds what it measured (values
checked against what they must be, not against a speed), and its sentence can be written.
Grading, the grader's footprint, the launcher and the rank start take tens of seconds a run
and are not run here: their figures' shapes are tested in tests/test_figures_page.py."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import figure_sentences as say  # noqa: E402  (benchmarks/figure_sentences.py)
import saved  # noqa: E402  (benchmarks/saved.py)

pytestmark = pytest.mark.multirank


def _bench(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}",
                                                  ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _run(name: str, args: list[str], tmp_path: Path) -> dict[str, dict]:
    path = tmp_path / f"{name}.json"
    _bench(name).main(args + ["--record", str(path)])
    entries = saved.entries(name, tmp_path)
    for entry in entries.values():
        assert entry["command"] == f"python benchmarks/{name}.py " + " ".join(args)
        assert entry["machine"]["cpus"] >= 1 and entry["machine"]["load_before"] >= 0
    return entries


def test_ddp_step_saves_each_world_size(tmp_path):
    from toolkit.models import TinyMLP, count_parameters

    entries = _run("ddp_step", ["--ranks", "2", "--steps", "2", "--width", "64"], tmp_path)
    f = entries["2 ranks"]["figures"]
    n = count_parameters(TinyMLP(d_in=16, d_hidden=64, d_out=16, depth=3, seed=0))
    assert f["parameters"] == n and f["gradient_bytes"] == 4 * n
    assert f["vs_torch"]["torch DDP"] == 1.0 and all(t > 0 for t in f["step_s"].values())
    assert f["all_reduces_per_step"]["naive"] == 8          # 4 Linear layers: weight + bias
    assert f["all_reduces_per_step"]["bucketed"] == 1       # 40 KiB fit one 4 MiB bucket
    assert "torch DDP's time at 2 ranks" in say.ddp(entries)


def test_fsdp_step_saves_equal_losses(tmp_path):
    entries = _run("fsdp_step", ["--ranks", "2", "--steps", "2", "--width", "64"], tmp_path)
    f = entries["2 ranks"]["figures"]
    assert f["vs_fsdp2"]["torch FSDP2"] == 1.0
    losses = list(f["loss"].values())
    assert max(losses) - min(losses) <= 1e-5 * abs(losses[0])   # the same training, any variant
    assert "FSDP2's time at 2 ranks" in say.fsdp(entries)


def test_memory_measured_saves_the_gaps(tmp_path):
    entries = _run("memory_measured", ["--world-sizes", "2", "--steps", "1"], tmp_path)
    f = entries["2 ranks"]["figures"]
    assert set(f["methods"]) == {"ddp", "zero1", "zero2", "fsdp", "torch_fsdp2"}
    for name in ("ddp", "zero1", "zero2", "fsdp"):       # the course's: exactly the padded bytes
        assert f["methods"][name]["max_gap_padded_bytes"] == 0
    assert f["methods"]["ddp"]["largest_rank_bytes"] == 16 * f["psi"]
    assert f["methods"]["ddp"]["volume_per_step_psi"] == 2.0
    assert "at most 0 B" in say.memory(entries)


def test_collectives_saves_ratios_and_fits_of_every_run(tmp_path):
    args = ["--sizes", "4K,16K,64K", "--world-sizes", "2", "--repeats", "2", "--max-repeats",
            "2", "--min-time", "0.001", "--runs", "2"]
    f = _run("collectives", args, tmp_path)["all_reduce"]["figures"]
    assert f["runs"] == 2 and f["sizes"] == [4096, 16384, 65536] and f["world_sizes"] == [2]
    for alg in ("sliced_ring", "ring"):
        cells = f["ratios"][alg]["2"]
        assert sorted(cells, key=int) == ["4096", "16384", "65536"]
        assert all(len(runs) == 2 and q25 <= q75 for runs in cells.values()
                   for _, q25, q75 in runs)
    fit = f["fits"]["sliced_ring p=2"]
    assert fit["nbytes"] == f["sizes"] and len(fit["errors"]) == 3
    assert len(fit["errors_on_other_runs"]) == 1 and len(fit["errors_on_other_runs"][0]) == 3


def test_pipeline_bubbles_saves_the_rows(tmp_path):
    entries = _run("pipeline_bubbles", ["--forward", "1", "--repeats", "1"], tmp_path)
    rows = entries["classic"]["figures"]["rows"]
    assert len(rows) == 2 * 3 * 2                       # p × m × (GPipe, 1F1B)
    for r in rows:
        assert r["formula"] == pytest.approx((r["p"] - 1) / (r["m"] + r["p"] - 1))
        assert 0 <= r["measured"] < 1 and len(r["peak_bytes"]) == r["p"]
    assert "p = 2, 4 and m = 1, 4, 8" in say.bubbles(entries)
