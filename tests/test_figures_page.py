"""docs/figures.md and the measured sentences of docs/grading.md are the saved measurements'
(benchmarks/figures_page.py writes them from benchmarks/results/*.json), and the words about
the machine are computed from the entries."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import cluster_figures as cluster  # noqa: E402  (benchmarks/cluster_figures.py)
import figure_sentences as say  # noqa: E402  (benchmarks/figure_sentences.py)
import figures_page  # noqa: E402  (benchmarks/figures_page.py)
import grading_figures as grader  # noqa: E402  (benchmarks/grading_figures.py)


def test_the_pages_are_written_from_the_saved_measurements(capsys):
    results = figures_page.load()
    for page, regions in figures_page.PAGES:
        text = page.read_text()
        assert figures_page.absent(text, regions) == [], page  # every region here (the edition
        # may lack an instructors' section's: tests/test_edition.py)
        assert figures_page.render(text, regions, results) == text, \
            f"{page.relative_to(ROOT)} is not up to date: python benchmarks/figures_page.py"
    assert figures_page.main(["--check"]) == 0
    assert "up to date" in capsys.readouterr().out


def _entry(figures: dict, *, load: float = 0.5, cpus: int = 2, date: str = "2026-01-02",
           command: str = "python benchmarks/x.py") -> dict:
    return {"command": command, "figures": figures,
            "machine": {"cpus": cpus, "load_before": load, "load_after": load + 0.25,
                        "date": date, "commit": "abc1234", "torch": "2.13.0"}}


def _ddp(p: int, overlapped: float, load: float = 0.5) -> dict:
    return _entry({"ranks": p, "gradient_bytes": 10 << 20, "steps": 40,
                   "vs_torch": {"torch DDP": 1.0, "naive": 3.5, "bucketed": 1.25,
                                "overlapped": overlapped}}, load=load,
                  command="python benchmarks/ddp_step.py --steps 40")


PAGE = """# Figures

<!-- measured: machine -->
typed by hand
<!-- /measured: machine -->

<!-- measured: table -->
| what | figure | measured by |
| old | 9.99× | x |
<!-- /measured: table -->

After.
"""


def test_sentences_machine_and_busy_marks_come_from_the_entries():
    results = {"ddp_step": {"2 ranks": _ddp(2, 0.96), "4 ranks": _ddp(4, 1.07, load=7.5)}}
    out = figures_page.render(PAGE, figures_page.FIGURES_REGIONS, results)
    assert "typed by hand" not in out and "9.99×" not in out and out.endswith("\n\nAfter.\n")
    row = next(line for line in out.splitlines() if line.startswith("| From-scratch DDP"))
    assert "0.96× torch DDP's time at 2 ranks and 1.07× at 4" in row
    assert "10 MiB of gradients, median of 40 steps" in row
    assert "(2026-01-02, 2 cores, load average 0.5-7.8 †)" in row      # one busy part: †
    assert "[`benchmarks/ddp_step.py`](../benchmarks/ddp_step.py) `--save --steps 40`" in row
    machine = out.split("<!-- measured: machine -->")[1]
    assert "on 2 CPU cores, 2026-01-02" in machine and "abc1234" in machine
    assert "between 0.5 and 7.8" in machine and "1 of the 2 measured parts" in machine
    # Nothing saved: the row says so and how to measure it, and nothing is busy.
    quiet = figures_page.render(PAGE, figures_page.FIGURES_REGIONS,
                                {"ddp_step": {"2 ranks": _ddp(2, 0.96)}})
    assert "Not measured yet: `python benchmarks/fsdp_step.py --save`" in quiet
    assert "†" not in quiet.split("<!-- measured: table -->")[1]
    assert "Nothing has been measured yet" in figures_page.render(
        PAGE, figures_page.FIGURES_REGIONS, {})


def test_the_class_and_the_rank_start_in_words():
    made = {"s000-correct": "correct", "s001-correct": "correct", "s002-stub": "stub",
            "s003-sleep_forever": "sleep_forever"}
    rows = [{"submission": "s000-correct", "score": "100.0", "seconds": "20.0"},
            {"submission": "s001-correct", "score": "100.0", "seconds": "30.0"},
            {"submission": "s002-stub", "score": "0.0", "seconds": "10.0"},
            {"submission": "s003-sleep_forever", "score": "12.0", "seconds": "80.0"}]
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import grading  # noqa: E402  (benchmarks/grading.py)

    f = grading.class_figures(rows, made, 140.0, 2)
    assert f["mix"] == {"correct": 2, "partial": 1, "fault": 1} and f["per_minute"] == 1.71
    assert f["median_s"] == 25.0 and f["correct_median_s"] == 25.0 and f["correct_p90_s"] == 30.0
    assert f["slowest"][0] == ["sleep_forever", 80.0] and f["full_marks_are_the_correct"]
    text = grader.grade_class({"class": _entry(f)})
    assert "A class of 4 lab-01 submissions (2 correct, 1 partial, 1 fault of the corpus)" in text
    assert "took 140 s: 1.7 submissions per minute" in text
    assert "the slowest `sleep_forever` 80.0 s, then `correct` 30.0 s" in text
    assert "every submission, and exactly the correct ones scored 100" in text
    f["full_marks_are_the_correct"], f["full_marks"] = False, 3
    assert "3 scored 100 (2 are correct)" in grader.grade_class({"class": _entry(f)})


def _footprint(**over) -> dict:
    return _entry({"score": 100.0, "max": 100, "launches": 9, "rss_mib": 250.4, "kinds": [],
                   "returned": 1 << 20, "calls": 260, "marks": 20, "kept": 3 << 19,
                   "held": 4096, "outbox": 1 << 19, "stacks": 1, **over})


GRADING = """Prose.

<!-- measured: rank-start -->
<!-- /measured: rank-start -->

<!-- measured: courier -->
| what | cap | reference solutions need | past the cap |
|---|---|---|---|
| calls and marks | `MAX_CALLS` = 50,000 | 999 | `call_limit` |
| results | `RESULT_BYTES` = 64 MiB | 9 MiB | `result_limit` |
<!-- /measured: courier -->

<!-- measured: attacks -->
<!-- /measured: attacks -->

<!-- measured: judges -->
| attack | grader's peak RSS, attack (reference) | seconds, attack (reference) | what it gets |
|---|---|---|---|
| `result_alias` (lab 01): 200 nodes | 1 MiB (2) | 3.0 (4.0) | typed |
| `broadcast_shapes` (lab 06): big | 1 MiB (2) | 3.0 (4.0) | typed |
<!-- /measured: judges -->

<!-- measured: timeout -->
<!-- /measured: timeout -->

<!-- measured: class -->
<!-- /measured: class -->
"""


def _fault(rss: float, kinds: list[str], score: float) -> dict:
    return _footprint(rss_mib=rss, kinds=kinds, score=score, max=40, seconds=5.25,
                      reference={"score": 40, "max": 40, "kinds": [], "rss_mib": 231.0,
                                 "seconds": 10.2})


def test_the_grading_tables_come_from_the_footprint_and_the_timeouts():
    results = {
        "grader_footprint": {
            "01_collectives": _footprint(), "05_tensor": _footprint(calls=300, rss_mib=310.0),
            "fault 01_collectives/output_hoard": _fault(646.0, ["result_limit"], 25),
            "fault 01_collectives/result_alias": _fault(244.0, ["tampering"], 25)},
        "grade_timeout": {
            "launch": _entry({"timeout_s": 30.0, "took_s": [31.8, 32.25], "score": [0, 0],
                              "valid": True}),
            "flood": _entry({"timeout_s": 30.0, "took_s": [26.4], "score": [6],
                             "valid": True})}}
    out = figures_page.render(GRADING, figures_page.GRADING_REGIONS, results)
    assert "| 300 (lab 05) | `call_limit` |" in out and "| 1 MiB (lab 01) |" in out
    assert "999" not in out and "9 MiB" not in out
    assert "the grader's peak RSS is 250-310 MiB" in out
    attacks = out.split("<!-- measured: attacks -->")[1].split("<!--")[0]
    assert "`output_hoard` (lab 01) 646 MiB (its lab's reference 231), result_limit, 25/40" \
        in attacks and "result_alias" not in attacks            # the memory attacks only
    judges = out.split("<!-- measured: judges -->")[1].split("<!--")[0]
    assert "| `result_alias` (lab 01): 200 nodes | 244 MiB (231) | 5.2 (10.2) | " \
        "`tampering`, 25/40 |" in judges and "typed" not in judges
    assert "| `broadcast_shapes` (lab 06): big | not measured yet |" in judges
    assert "Measured 2026-01-02, 2 cores" in judges
    assert "[`benchmarks/grader_footprint.py`]" in judges
    timeout = out.split("<!-- measured: timeout -->")[1].split("<!--")[0]
    assert "| provocation | ended after (T = 30 s) | past T | results.json |" in timeout
    assert "| 31.8 s, 32.2 s | +1.8 s, +2.2 s | valid |" in timeout
    assert "(`traffic_flood`) | 26.4 s | inside | valid |" in timeout
    assert "judge that sleeps" not in timeout                   # not measured: no row
    assert "Not measured yet: `python benchmarks/rank_start.py --save`" in out
    with pytest.raises(ValueError, match="names none of"):
        figures_page.render(GRADING.replace("`RESULT_BYTES`", "`OTHER`"),
                            figures_page.GRADING_REGIONS, results)


def test_a_page_without_its_region_is_refused():
    with pytest.raises(ValueError, match="measured: table"):
        figures_page.render(PAGE.replace("<!-- /measured: table -->", ""),
                            figures_page.FIGURES_REGIONS, {})
    # Both markers gone (a section the student edition left out): skipped, the rest written.
    without = PAGE.split("<!-- measured: table -->")[0] + "After.\n"
    assert figures_page.absent(without, figures_page.FIGURES_REGIONS) == ["table"]
    out = figures_page.render(without, figures_page.FIGURES_REGIONS, {})
    assert "Nothing has been measured yet" in out and out.endswith("After.\n")
    with pytest.raises(ValueError, match="reference solutions need"):
        figures_page.render(GRADING.replace("reference solutions need", "need"),
                            figures_page.GRADING_REGIONS, {})


def test_formats():
    assert [say.seconds(s) for s in (2.5e-7, 5.3e-6, 0.0912, 2.83, 2329.4)] == \
        ["0.25 µs", "5.3 µs", "91.2 ms", "2.83 s", "2,329 s"]
    assert say.span([1.05, 1.15, 1.1]) == "1.05-1.15" and say.span([2.0, 2.001]) == "2.00"
    assert say.plural(1, "run") == "1 run" and say.plural(3, "launch", "launches") == "3 launches"


def test_the_cluster_page_figures_come_from_their_entries():
    """docs/cluster.md: the wheelhouse, gpu-check's steps (a GPU run first, a rehearsal alone
    says no GPU has run it) and the cluster paths' table, each with when and the command."""
    steps = [["environment", "ok", 20.4], ["GPU figures", "ok", 3.6], ["grading", "FAILED", 95.0]]
    rehearsal = _entry({"gpus": 0, "placement": "cpu", "worlds": [2], "quick": True,
                        "lessons": ["00"], "budget_s": 480.0, "steps": steps, "total_s": 119.0},
                       command="python benchmarks/gpu_check.py --device cpu --quick")
    runs = [{p: s for _, p, _ in cluster.PATHS} for s in (0.5, 30.0, 12.0)]
    results = {
        "wheelhouse": {"python 3.12 x86_64": _entry(
            {"python": "3.12", "platform": "x86_64", "wheels": 53, "bytes": 58_363_426},
            command="python benchmarks/wheelhouse.py download --python 3.12")},
        "gpu_check": {"cpu": rehearsal},
        "cluster_paths": {"tests": _entry({"runs": runs}, load=9.0,
                                          command="python benchmarks/cluster_paths.py")},
    }
    page = "".join(f"<!-- measured: {n} -->\nold\n<!-- /measured: {n} -->\n"
                   for n in figures_page.CLUSTER_REGIONS)
    out = figures_page.render(page, figures_page.CLUSTER_REGIONS, results)
    assert "old" not in out
    assert ("`make wheelhouse` downloaded 53 wheels, 58 MB for Python 3.12 on x86_64 "
            "(2026-01-02, 2 cores, load average 0.5-0.8; [`benchmarks/wheelhouse.py`]"
            "(../benchmarks/wheelhouse.py) `download --python 3.12 --save`)") in out
    assert out.count("Not yet run on a GPU") == 1
    assert ("The CPU rehearsal (`--device cpu`, `--quick`, lessons 00): 2 of 3 steps passed in "
            "119 s of its 480 s budget: environment 20 s, GPU figures 4 s, grading 95 s "
            "(FAILED)") in out
    assert "Median of 3 runs and range, in seconds:" in out
    # One format per row, chosen by its median: whole seconds from 10 s.
    assert "| 3 lab-01 submissions, 2 array tasks, one summary.csv | 12 (0-30) |" in out
    same = figures_page.render(page, figures_page.CLUSTER_REGIONS, {**results, "cluster_paths": {
        "tests": _entry({"runs": runs[1:2] * 2})}})
    assert "| 3 lab-01 submissions, 2 array tasks, one summary.csv | 30 |" in same  # no range
    assert "load average 9.0-9.2 †" in out              # the busy run is marked
    gpu = {**rehearsal, "figures": {**rehearsal["figures"], "gpus": 1, "placement": "shared"}}
    both = figures_page.render(page, figures_page.CLUSTER_REGIONS,
                               {**results, "gpu_check": {"cpu": rehearsal, "1 GPU(s)": gpu}})
    assert "Not yet run on a GPU" not in both
    assert both.index("On 1 GPU (placement shared") < both.index("The CPU rehearsal")
    nothing = figures_page.render(page, figures_page.CLUSTER_REGIONS, {})
    assert "Not measured yet: `python benchmarks/wheelhouse.py download --save`" in nothing
    assert "Not measured yet: `python benchmarks/cluster_paths.py --save`" in nothing
