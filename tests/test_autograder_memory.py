"""The grader's own memory under the red team's attacks (docs/grading.md, "Grader memory"):
results returned without end, marks without end, stacks without end. Each grade runs in a
child process that reports its own peak RSS (VmHWM, `watchdog.peak_rss_mib`; not
``ru_maxrss``, which a child inherits from the pytest worker that started it): it must stay
under a bound,
where the grader used to reach 3.6 GB (results) and 2.6 GB (marks). The offending checks score
zero with the limit named, the others full; nothing of the grade is left.

The attacks are sized so that keeping what they send (as the grader did before the courier's
caps and judging each launch as it ends) would pass each fault's bound: 4 launches × 240 MiB
of results, or 4 launches × 600,000 marks of ~350 B, over 1 GiB; 15,000 stacks of ~32 KB in
one launch, over 640 MiB. A correct grade of lab 01 peaks at about 230 MiB, the result hoard
at about 590 MiB (4 ranks' 60 MiB frames being read at once), the others under 300 MiB
(benchmarks/grader_footprint.py). The stack flood's check gets a long timeout: it ends in a
deadlock once rank 0 has written every stack, however slowly a loaded machine reads them.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from faultkit import LIMITS, ROOT, small_lab, submission, survivors

import autograder.grade as grade_module
from autograder.grade import grade
from autograder.judging import judge_launch
from autograder.lab import find_lab, load_lab

# fault → (checks run, in order; the kind each offending check gets; the pattern its message
# has; the bound on the grader's peak RSS in MiB; the checks' timeout in s). Every other check
# must score full.
MEMORY_FAULTS = {
    "output_hoard": (["ar4", "ar4", "ar4", "ar4", "tree", "ag"], "result_limit",
                     r"keeps at most 64 MiB", 1024, 30),
    "mark_flood": (["ar4", "ar4", "ar4", "ar4", "tree", "ag"], "call_limit",
                   r"over 50,000 communication calls and marks", 1024, 30),
    "result_tree_bomb": (["ar4", "ar4", "tree", "ag"], "result_limit",
                         r"more than 20,000 values", 1024, 60),
    "stack_flood": (["ar", "tree", "ag"], "deadlock", r"rank 0 in 14,99\d more calls", 640, 150),
    # 200 nodes naming one 8 MiB payload: 1.6 GB per frame once decoded, before tensors had to
    # name bytes of their own (issue 30); refused now before a tensor is built.
    "result_alias": (["ar4", "ar4", "tree", "ag"], "tampering",
                     r"two tensors name the same bytes", 640, 30),
}

_CHILD = """
import dataclasses, json, sys
from pathlib import Path
sys.path.insert(0, {tests!r})
from faultkit import LIMITS, small_lab
from autograder.sandbox.watchdog import peak_rss_mib
from autograder.grade import grade
from autograder.lab import find_lab, load_lab
from autograder.report import to_results_json, validate_results
names, timeout = json.loads(sys.argv[2]), float(sys.argv[4])
lab = small_lab(load_lab(find_lab("01_collectives"), hidden=False), names)
lab = dataclasses.replace(lab, checks=[dataclasses.replace(c, timeout=timeout)
                                       for c in lab.checks])
limits = dataclasses.replace(LIMITS, wall_s=timeout * len(names) + 60)
result = grade(lab, Path(sys.argv[1]), limits=limits, workbase=Path(sys.argv[3]))
problems = validate_results(to_results_json(result))
print(json.dumps({{"problems": problems, "notes": result.notes,
                  "rss_mib": peak_rss_mib(),
                  "checks": [[c.score, c.check.points, c.kind, c.message]
                             for c in result.checks]}}))
"""


def _grade_in_child(fault: str, names: list[str], timeout: float, tmp_path) -> dict:
    work = tmp_path / "runs"
    work.mkdir()
    path = submission(fault, tmp_path / "submissions")
    script = tmp_path / "grade_child.py"
    script.write_text(_CHILD.format(tests=str(ROOT / "tests")))
    out = subprocess.run([sys.executable, str(script), str(path), json.dumps(names), str(work),
                          str(timeout)], capture_output=True, text=True, cwd=tmp_path,
                         timeout=timeout * len(names) + 300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert not survivors(work), f"processes of the grade still running: {survivors(work)}"
    assert list(work.iterdir()) == [], "the grade's folder was left behind"
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("fault", sorted(MEMORY_FAULTS))
def test_a_memory_attack_costs_its_checks_and_the_grader_stays_bounded(fault, tmp_path):
    names, kind, says, bound_mib, timeout = MEMORY_FAULTS[fault]
    got = _grade_in_child(fault, names, timeout, tmp_path)
    assert got["problems"] == []
    for name, (score, points, got_kind, message) in zip(names, got["checks"]):
        if name.startswith("ar"):
            assert (score, got_kind) == (0, kind), (name, got_kind, message)
        else:
            assert (score, got_kind) == (points, None), (name, got_kind, message)
    assert re.search(says, got["checks"][0][3]), got["checks"][0][3]
    if kind.endswith("_limit"):
        assert any(kind in note for note in got["notes"]), got["notes"]
    assert got["rss_mib"] < bound_mib, f"the grader peaked at {got['rss_mib']:,.0f} MiB"


# Other labs' attacks on the judges (issue 30), graded on the first case of the visible checks
# named (faultkit.grade_fault_on_checks) in a child that reports its peak RSS: lab → (fault,
# check name prefixes, the kind each gets, the pattern its message has, the bound in MiB).
JUDGE_FAULTS = {
    # (2²¹, 1, 1) bf16 results broadcast against the reference: 5.4 GB before forms
    "06_mixed_precision": ("broadcast_shapes", ["LossScaler.unscale_", "all_reduce_gradients",
                                                "train_step: masters follow"], "wrong_result",
                           r"does not have the form .* shape \(2097152, 1, 1\), expected", 640),
    # 20,000 all-reduces in one backward: a judge quadratic in them took 9.9 s a call
    "02_ddp": ("traffic_flood", ["DDP: one all-reduce per bucket"], "wrong_result",
               r"20006 all-reduces in 2 steps", 640),
}

_JUDGE_CHILD = """
import json, sys
from pathlib import Path
sys.path.insert(0, {tests!r})
from faultkit import grade_fault_on_checks
from autograder.sandbox.watchdog import peak_rss_mib
lab_dir, faults, fault, prefixes, tmp = sys.argv[1:6]
checks = grade_fault_on_checks(Path(lab_dir), Path(faults), fault, json.loads(prefixes),
                               Path(tmp))
print(json.dumps({{"rss_mib": peak_rss_mib(),
                  "checks": [[c.score, c.kind, c.message] for c in checks]}}))
"""


@pytest.mark.parametrize("lab", sorted(JUDGE_FAULTS))
def test_a_judge_attack_fails_its_checks_and_the_grader_stays_bounded(lab, tmp_path):
    fault, prefixes, kind, says, bound_mib = JUDGE_FAULTS[lab]
    script = tmp_path / "judge_child.py"
    script.write_text(_JUDGE_CHILD.format(tests=str(ROOT / "tests")))
    out = subprocess.run([sys.executable, str(script), str(ROOT / "labs" / lab),
                          str(ROOT / "tests" / "faults" / lab), fault, json.dumps(prefixes),
                          str(tmp_path / "runs")], capture_output=True, text=True, cwd=tmp_path,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    for score, got_kind, message in got["checks"]:
        assert (score, got_kind) == (0, kind), (got_kind, message)
        assert re.search(says, message), message
    assert got["rss_mib"] < bound_mib, f"the grader peaked at {got['rss_mib']:,.0f} MiB"


def test_judging_each_launch_as_it_ends_changes_no_result(tmp_path, monkeypatch):
    """The same grade (same secret) judged launch by launch, dropping each launch's outputs
    and record, and judged all at once after the last launch: the same scores, kinds and
    messages."""
    lab = small_lab(load_lab(find_lab("01_collectives"), hidden=False), ["ar", "ring", "tree",
                                                                          "ag"])
    path = submission("mistake_chunk_order", tmp_path / "submissions")
    dropped = []

    def judged_now(lab_, record, cases, **budget):
        judge_launch(lab_, record, cases, **budget)
        dropped.append((record.verdicts is not None, record.outputs, record.traffic))

    def summary():
        result = grade(lab, path, limits=LIMITS, workbase=tmp_path, secret=1234)
        return [(c.score, c.passed, c.kind, c.message) for c in result.checks]

    monkeypatch.setattr(grade_module, "judge_launch", judged_now)
    early = summary()
    monkeypatch.setattr(grade_module, "judge_launch", lambda lab_, record, cases, **_: None)
    late = summary()
    assert early == late
    assert len(dropped) == 4 and all(d == (True, {}, {}) for d in dropped)
    assert [s[0] for s in early] != [c.points for c in lab.checks]  # the mistake shows


def test_the_peak_is_the_child_s_own_not_its_parent_s():
    """Linux keeps ``ru_maxrss`` across execve: a grader started by a big process (this pytest
    worker after other tests) reported the worker's peak (650 MiB in CI, failing the bounds
    above). `peak_rss_mib` reads VmHWM, which starts again at exec."""
    held = bytearray(400 << 20)
    for i in range(0, len(held), 4096):
        held[i] = 1                                       # touched: resident in this process
    code = ("import json, resource; from autograder.sandbox.watchdog import peak_rss_mib; "
            "print(json.dumps([peak_rss_mib(), "
            "resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024]))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    del held
    own, inherited = json.loads(done.stdout)
    # `inherited` is about 400 or more on Linux (the kernel's choice, so not asserted); the
    # grader's own figure is its interpreter and imports only.
    assert 0 < own < 200, (own, inherited)
