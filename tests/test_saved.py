"""benchmarks/saved.py: a benchmark's figures are saved with the machine they were taken on,
one entry per part, other entries kept, and the file is never left half written."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import saved  # noqa: E402  (benchmarks/saved.py)


def test_an_entry_is_added_beside_the_others_and_replaces_its_own(tmp_path):
    path = tmp_path / "results" / "bench.json"
    saved.write(path, "4 ranks", {"figures": {"x": 1}}, about="what", script="benchmarks/b.py")
    saved.write(path, "2 ranks", {"figures": {"x": 2}}, about="ignored: the first stays")
    saved.write(path, "4 ranks", {"figures": {"x": 3}}, about="what")
    data = json.loads(path.read_text())
    assert data["about"] == "what" and data["script"] == "benchmarks/b.py"
    assert data["entries"] == {"2 ranks": {"figures": {"x": 2}}, "4 ranks": {"figures": {"x": 3}}}
    assert list(data["entries"]) == ["2 ranks", "4 ranks"]            # sorted: stable diffs
    assert [p.name for p in path.parent.iterdir()] == ["bench.json"]  # no temporary file left


def test_a_failed_write_leaves_the_earlier_file_whole(tmp_path, monkeypatch):
    path = tmp_path / "bench.json"
    saved.write(path, "a", {"figures": {"x": 1}}, about="what")
    before = path.read_text()

    def crash(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk full"):
        saved.write(path, "b", {"figures": {"x": 2}}, about="what")
    assert path.read_text() == before
    assert [p.name for p in tmp_path.iterdir()] == ["bench.json"]


def test_a_record_holds_the_command_the_machine_and_rounded_figures(tmp_path):
    path = tmp_path / "ddp_step.json"
    saved.record(path, "ddp_step", "2 ranks", {"t": 0.123456789, "n": [1, 2.000000123]},
                 about="what", load_before=1.5,
                 argv=["--steps", "2", "--record", str(path), "--save"])
    entry = saved.entries("ddp_step", tmp_path)["2 ranks"]
    assert entry["command"] == "python benchmarks/ddp_step.py --steps 2"
    assert entry["figures"] == {"t": 0.123457, "n": [1, 2.0]}
    m = entry["machine"]
    assert m["cpus"] == os.cpu_count() and m["load_before"] == 1.5
    assert isinstance(m["load_after"], float) and len(m["date"]) == 10
    assert m["commit"].split("+")[0] and m["torch"]
    saved.record(None, "ddp_step", "4 ranks", {}, about="", load_before=0.0, argv=[])
    assert list(saved.entries("ddp_step", tmp_path)) == ["2 ranks"]   # no file: nothing saved
    assert saved.entries("never_saved", tmp_path) == {}


def test_save_and_record_options():
    import argparse

    ap = argparse.ArgumentParser()
    saved.add_arguments(ap, "ddp_step")
    assert saved.target(ap, ap.parse_args([]), "ddp_step") is None
    assert saved.target(ap, ap.parse_args(["--save"]), "ddp_step") == saved.path_of("ddp_step")
    assert saved.target(ap, ap.parse_args(["--record", "x.json"]), "ddp_step") == Path("x.json")
    with pytest.raises(SystemExit):
        saved.target(ap, ap.parse_args(["--record", "x.csv"]), "ddp_step")
    assert saved.command("x", ["--record=a.json", "--n", "a b"]) == \
        "python benchmarks/x.py --n 'a b'"


def test_the_lesson_measurements_keep_their_own_section(tmp_path):
    import lesson_resources  # noqa: E402  (benchmarks/lesson_resources.py)

    path = tmp_path / "lessons.json"
    lesson_resources.save(path, "01_b.ipynb", {"wall_s": 2.0, "peak_mib": 300})
    lesson_resources.save(path, "00_a.ipynb", {"wall_s": 1.0, "peak_mib": 200})
    data = json.loads(path.read_text())
    assert list(data["lessons"]) == ["00_a.ipynb", "01_b.ipynb"] and "entries" not in data
    assert data["about"] == lesson_resources.ABOUT
