"""benchmarks/collectives.py (the nccl-tests-style command) and the results folder format."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pandas as pd
import pytest

from toolkit.cost.results import FORMAT, load_all, load_results, machine_meta, save_results

ROOT = Path(__file__).resolve().parents[1]


def _bench(script: str = "collectives"):
    spec = importlib.util.spec_from_file_location(f"bench_{script}",
                                                  ROOT / "benchmarks" / f"{script}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_size_parsing():
    bench = _bench()
    assert bench.parse_sizes("4K:64K") == [4096, 16384, 65536]
    assert bench.parse_sizes("1K:8K:2") == [1024, 2048, 4096, 8192]
    assert bench.parse_sizes("4096,1M,64MB") == [4096, 1 << 20, 64 << 20]
    for bad in ("4Q", "64M:4K", "0"):
        with pytest.raises(Exception, match="size|range"):
            bench.parse_sizes(bad)


@pytest.mark.multirank
def test_small_run_prints_tables_and_saves_a_results_folder(tmp_path, capsys):
    bench = _bench()
    out = tmp_path / "laptop"
    code = bench.main(["--collectives", "all_reduce,all_gather", "--algorithms", "ring,torch",
                       "--sizes", "4K,16K,64K", "--world-sizes", "2", "--repeats", "2",
                       "--max-repeats", "2", "--min-time", "0.001", "--runs", "2",
                       "--out", str(out)])
    text = capsys.readouterr().out
    assert code == 0
    assert "# all_reduce, 2 ranks, gloo" in text and "bus bandwidth" in text
    assert "toolkit / built-in time, paired trial by trial" in text
    assert "α-β fits per (collective, algorithm, p)" in text and "piecewise: max" in text
    assert "on run 2 :" in text                      # the first run's model on the second run
    # The runs side by side: one line per (p, size) with both medians and their ranges.
    lines = [ln for ln in text.splitlines() if ln.startswith("  p=2 ") and " / " in ln]
    assert len(lines) == 2 * 3 and all(("agree" in ln) != ("DISAGREE" in ln) for ln in lines)
    table, meta = load_results(out)
    assert len(table) == 2 * 2 * 3 * 2 and sorted(set(table.run_index)) == [1, 2]
    assert meta["backend"] == "gloo" and meta["format"] == FORMAT
    assert meta["args"]["world_sizes"] == "2" and isinstance(meta["runs_agree"], bool)
    ring = table[(table.algorithm == "ring") & (table.collective == "all_reduce")]
    assert (ring.baseline == "torch").all() and (ring.ratio_q25 <= ring.ratio_q75).all()
    html = (out / "report.html").read_text()
    assert "plotly" in html and "all_reduce, p=2" in html


def test_default_cases_and_slice_sweep_labels():
    bench = _bench()
    args = bench.argparse.Namespace(collectives="all_reduce,broadcast", algorithms="default",
                                    slices=[65536])
    cases = bench.cases_from(args, None)
    assert cases == [("all_reduce", "sliced_ring"), ("all_reduce", "ring"), ("all_reduce", "torch"),
                     ("all_reduce", "sliced_ring:slice_bytes=65536"), ("broadcast", "tree"),
                     ("broadcast", "torch")]


def test_bad_arguments_exit_with_a_message(capsys):
    bench = _bench()
    with pytest.raises(SystemExit):
        bench.main(["--collectives", "all_to_al"])
    assert "unknown 'all_to_al'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["--world-sizes", "two"])
    assert "integers" in capsys.readouterr().err


def test_results_round_trip_and_stacking(tmp_path):
    table = pd.DataFrame({"collective": ["all_reduce"], "algorithm": ["ring"], "p": [2],
                          "nbytes": [4096], "seconds": [1e-4]})
    for name in ("laptop", "gpu"):
        save_results(table, tmp_path / name, machine_meta("gloo"))
    both = load_all([tmp_path / "laptop", tmp_path / "gpu"])
    assert list(both.run) == ["laptop", "gpu"]
    assert not list(tmp_path.glob("*/.*.tmp"))
    with pytest.raises(FileNotFoundError, match="not a results folder"):
        load_results(tmp_path / "missing")
    meta = json.loads((tmp_path / "gpu" / "meta.json").read_text())
    meta["format"] = 999
    (tmp_path / "gpu" / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="re-run"):
        load_results(tmp_path / "gpu")


@pytest.mark.multirank
def test_cpu_per_call_is_split_by_thread_and_summed_over_ranks():
    bench = _bench("collective_cpu")
    table = bench.measure("all_reduce", ["sliced_ring", "torch"], [64 << 10], 2, rounds=2)
    assert set(table) == {("sliced_ring", 64 << 10), ("torch", 64 << 10)}
    for (label, _), (totals, by_kind) in table.items():
        assert len(totals) == 2 and all(t > 0 for t in totals)
        # the toolkit's ring runs in the rank's own thread; torch's in gloo's worker, idle
        # (a few wake-ups at most) while the toolkit's ring runs
        assert "main" in by_kind and "gloo_tcp_loop" in by_kind
        worker = sum(by_kind.get("pt_gloo_runloop", [0.0]))
        assert worker > 0 if label == "torch" else worker < 0.01 * sum(by_kind["main"])
        assert totals == [sum(v[i] for v in by_kind.values()) for i in range(2)]
    with pytest.raises(SystemExit):
        bench.main(["--algorithms", "butterfly"])
