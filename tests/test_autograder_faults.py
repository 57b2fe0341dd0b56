"""The fault corpus: bad submissions of lab 01 that the grader must survive. Each file in
tests/faults/01_collectives/ holds only what its fault changes (a function redefined, a module
statement added); `submission` appends it to the reference solution, so the later definitions
win and the rest of the file is the working lab. For each: a valid results.json, zero on the
checks the fault touches (the others still pass), the failure kind a student or instructor
filters on, a message that says where, and no process left anywhere (the autouse fixture checks
this process's children; `_survivors` checks the whole machine for anything started in the
grade's folder).

Grades run on a small lab (a few visible checks, 1-2 cases each) to keep each test at a few
seconds: what is under test is the grader, not the lab's coverage. Checks that are meant to hang
get an 8 s timeout, long enough for every rank of a loaded laptop to reach the place the report
names; the others keep a generous one so that a busy machine cannot turn a correct check into a
timeout. Nothing here asserts how long a grade took or which line a rank had reached when the
timing decides it (which call a waiting rank was in when gloo noticed its peer had left, say).
"""

from __future__ import annotations

import ast
import dataclasses
import json
import ctypes
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from autograder.failures import KINDS
from autograder.grade import grade
from autograder.lab import Lab, find_lab, load_lab
from autograder.report import to_results_json, validate_results
from autograder.sandbox.cgroup import PidsGroup
from autograder.sandbox.landlock import abi_version as landlock_abi
from autograder.sandbox.limits import Limits, sandbox_uid

ROOT = Path(__file__).resolve().parent.parent
FAULTS = ROOT / "tests" / "faults" / "01_collectives"
HANG_S = 8.0      # timeout of a check that is meant to hang (ranks of a busy machine get there)
SAFE_S = 20.0     # timeout of a check that is meant to finish
LIMITS = Limits(wall_s=60, processes=64)


def _case(p: int, n: int, seed: int, **extra) -> dict:
    return {"world_size": p, "dtype": "float32", "seed": seed, "numel": n, **extra}


# Small checks built from the lab's visible ones (same judges, fewer cases): name → (index in
# the visible checks, cases or None to keep them).
SMALL = {
    "ar": (0, (_case(2, 8, 0),)),             # ring_all_reduce values, 2 ranks
    "ar4": (0, (_case(4, 8, 1),)),            # ring_all_reduce values, 4 ranks
    "bcast": (2, (_case(3, 100, 30, src=1),)),
    "tree": (3, None),                        # binomial-tree traffic, 4 ranks, 2 roots
    "ag": (5, (_case(4, 12, 70),)),           # ring_all_gather values, 4 ranks
}


@pytest.fixture(scope="module")
def lab01() -> Lab:
    return load_lab(find_lab("01_collectives"), hidden=False)


def small_lab(lab: Lab, names: list[str], hang: set[str] = frozenset()) -> Lab:
    checks = []
    for name in names:
        index, cases = SMALL[name]
        check = lab.checks[index]
        checks.append(dataclasses.replace(check, cases=cases or check.cases,
                                          timeout=HANG_S if name in hang else SAFE_S))
    return dataclasses.replace(lab, checks=checks)


def _survivors(folder: Path) -> list[str]:
    """Processes anywhere on the machine whose command line names `folder` (the grade's)."""
    out = []
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        try:
            if str(folder) in " ".join(p.info["cmdline"] or []):
                out.append(f"{p.info['pid']} {p.info['status']}")
        except psutil.Error:
            pass
    return out


REFERENCE = ROOT / "labs" / "01_collectives" / "collectives.py"


def _source(fault: str) -> str:
    return REFERENCE.read_text() + f"\n\n# ---- fault: {fault} ----\n\n" + \
        (FAULTS / f"{fault}.py").read_text()


def submission(fault: str, folder: Path) -> Path:
    """The fault's submission: the reference solution followed by the fault's code."""
    path = folder / fault / "collectives.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(_source(fault))
    return path


def _line(fault: str, text: str) -> int:
    """The line number of `text` in the fault's submission, searched in the fault's part (for
    'names the student's line')."""
    lines = _source(fault).splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("# ---- fault:"))
    return next(i for i, line in enumerate(lines, 1) if i > start and text in line)


RING = ("exchange", "ring_reduce_scatter", "ring_all_gather", "ring_all_reduce")


def _ring_lines(fault: str) -> str:
    """A regex matching any line of the ring's functions as the fault's submission defines them
    (the last definition of a name wins, as when Python runs the file)."""
    spans = {}
    for node in ast.parse(_source(fault)).body:
        if isinstance(node, ast.FunctionDef) and node.name in RING:
            spans[node.name] = range(node.lineno, node.end_lineno + 1)
    return "(?:" + "|".join(str(n) for span in spans.values() for n in span) + r")\b"


def run_fault(lab: Lab, fault: str, names: list[str], tmp_path: Path, *,
              hang: set[str] = frozenset(), limits: Limits = LIMITS):
    small = small_lab(lab, names, hang)
    work = tmp_path / "runs"
    work.mkdir(exist_ok=True)
    start = time.monotonic()
    result = grade(small, submission(fault, tmp_path / "submissions"), limits=limits,
                   workbase=work)
    seconds = time.monotonic() - start
    data = to_results_json(result)
    assert validate_results(data) == [], data
    json.dumps(data)  # plain JSON all the way down
    assert not _survivors(work), f"processes of the grade still running: {_survivors(work)}"
    by_name = dict(zip(names, result.checks))
    return result, by_name, seconds


def assert_failed(check, kind: str, *says: str) -> None:
    assert kind in KINDS
    assert (check.score, check.passed, check.kind) == (0, 0, kind), (check.kind, check.message)
    for text in says:
        assert re.search(text, check.message), f"{text!r} not in {check.message!r}"


# fault → (checks it runs, the checks that must fail with their kind, regexes the first failed
# check's message must match, checks given the short timeout). Unnamed checks must pass.
CASES = {
    "import_error": (["ar"], {"ar": "import_error"}, [r"nonexistent_pkg"], set()),
    "exception_one_rank": (["ar", "tree"], {"ar": "exception"},
                           [r"Rank 1 raised RuntimeError: rank 1 gives up", "LINE"], set()),
    "exit_one_rank": (["ar", "tree"], {"ar": "crash"}, [r"Rank 1 exited \(code 3\)"], set()),
    "segfault_one_rank": (["ar", "tree"], {"ar": "crash"}, [r"Rank 1 died from SIGSEGV", "LINE"],
                          set()),
    # Which call of the ring rank 0 was in when gloo noticed its peer had left is timing: the
    # report names a line of the ring (RING), whichever it was.
    "deadlock_skip": (["ar"], {"ar": "deadlock"},
                      [r"rank 0", r"collectives\.py line RING", r"skips one or returns early"],
                      {"ar"}),
    "deadlock_blocking_ring": (["ar"], {"ar": "deadlock"},
                               [r"rank 0 in send to rank 1", r"rank 1 in send to rank 0"], {"ar"}),
    "mismatched_sizes": (["ar"], {"ar": "mismatch"},
                         [r"20 bytes arrived for a 16-byte buffer", r"gloo aborted"], set()),
    "infinite_loop": (["ar"], {"ar": "timeout"},
                      [r"rank 0 at collectives\.py line LINE",
                       r"rank 1 in i(send|recv)\.wait"], {"ar"}),
    "sleep_forever": (["ar"], {"ar": "timeout"}, [r"rank 0 at collectives\.py line LINE"], {"ar"}),
    "memory_bomb": (["ar", "tree"], {"ar": "memory_limit"}, [r"can't allocate memory"], set()),
    "builtin_all_reduce": (["ar", "tree"], {"ar": "builtin_collective"}, [r"all_reduce"], set()),
    "forbidden_import": (["ar"], {"ar": "forbidden_import"}, [r"toolkit\.collectives"], set()),
    "read_reference": (["ar"], {"ar": "sandbox_violation"},
                       [r"Permission denied: '.*labs/01_collectives/collectives\.py'"], set()),
    "read_hidden_checks": (["ar", "tree"], {"ar": "sandbox_violation"},
                           [r"Permission denied: '.*hidden/checks\.py'"], set()),
    "patch_allclose": (["ar", "tree"], {"ar": "wrong_result"}, [r"own input"], set()),
    "patch_isend": (["ar", "tree"], {"ar": "tampering", "tree": "tampering"},
                    [r"torch\.distributed\.isend|distributed_c10d\.isend"], set()),
    "patch_recorder": (["tree"], {"tree": "tampering"}, [r"toolkit\.comm\.events\.Trace\.totals"],
                       set()),
    "forge_observations": (["ar", "tree"], {"ar": "sandbox_violation"},
                           [r"Permission denied: 'observations\.jsonl'"], set()),
    "root_capabilities": (["ar", "tree"], {"ar": "sandbox_violation"},
                          [r"Operation not permitted: '.*owned-"], set()),
    "hidden_builtin": (["ar", "tree"], {"ar": "tampering"},
                       [r"bytes that no recorded message accounts for"], set()),
    # Recognised mistakes: partial scores, feedback that names the mistake.
    "mistake_averaged": (["ar", "tree"], {"ar": "wrong_result"}, [r"averaged instead of summed"],
                         set()),
    "mistake_no_communication": (["ar", "tree"], {"ar": "wrong_result"},
                                 [r"no communication happened"], set()),
    "mistake_reduce_only": (["ar4", "tree"], {"ar4": "wrong_result"},
                            [r"right only on rank 0", r"not an all-reduce"], set()),
    "mistake_chunk_order": (["ag", "tree"], {"ag": "wrong_result"},
                            [r"right chunks in the wrong order"], set()),
    "mistake_linear_broadcast": (["bcast", "tree"], {"tree": "wrong_result"},
                                 [r"linear broadcast, not a tree"], set()),
}
# The line each message must name, where a pattern says LINE.
LINES = {"exception_one_rank": "raise RuntimeError", "segfault_one_rank": "string_at(0)",
         "infinite_loop": "while rank == 0", "sleep_forever": "time.sleep(10_000)"}


@pytest.mark.parametrize("fault", sorted(CASES))
def test_fault_is_named_and_zeroed(lab01, fault, tmp_path):
    names, failing, says, hang = CASES[fault]
    result, by_name, _ = run_fault(lab01, fault, names, tmp_path, hang=hang)
    line = str(_line(fault, LINES[fault])) if fault in LINES else ""
    first = next(n for n in names if n in failing)
    says = [s.replace("LINE", line).replace("RING", _ring_lines(fault)) for s in says]
    assert_failed(by_name[first], failing[first], *says)
    for name in names:
        if name in failing:
            assert_failed(by_name[name], failing[name])
        else:
            assert by_name[name].ok and by_name[name].score == by_name[name].check.points, \
                (name, by_name[name].kind, by_name[name].message)
    # A hang is ended by its check's own timeout (the kinds above say so: the grade's wall limit
    # would have named itself), never by how fast this machine is: no time is asserted.


def test_syntax_error_is_found_before_anything_runs(lab01, tmp_path):
    result, by_name, _ = run_fault(lab01, "syntax_error", ["ar", "tree"], tmp_path)
    line = _line("syntax_error", "(rank - 1 % p")
    for check in result.checks:
        assert_failed(check, "syntax_error", rf"collectives\.py line {line}", r"never closed")
    assert result.sandbox == ""  # parsed here, no sandbox started


def test_forged_results_in_tmp_zero_the_grade(lab01, tmp_path):
    """$TMPDIR is the one folder a rank may write: a results.json found there zeroes it all."""
    result, _, _ = run_fault(lab01, "forged_results_tmp", ["ar", "tree"], tmp_path)
    assert result.score == 0
    for check in result.checks:  # even the untouched tree check
        assert_failed(check, "forged_results", r"results\.json")


def test_forged_results_in_its_folder_are_refused(lab01, tmp_path):
    result, by_name, _ = run_fault(lab01, "forged_results_cwd", ["ar", "tree"], tmp_path)
    assert_failed(by_name["ar"], "forged_results", r"Permission denied: 'results\.json'")
    assert by_name["tree"].ok


def test_forged_results_outside_its_folder_are_refused(lab01, tmp_path):
    """The fault writes into the folder above its working folder: here `runs/`."""
    result, by_name, _ = run_fault(lab01, "forged_results_abs", ["ar", "tree"], tmp_path)
    assert not (tmp_path / "runs" / "results.json").exists()
    assert_failed(by_name["ar"], "forged_results", r"Permission denied: '.*results\.json'")
    assert by_name["tree"].ok


def test_output_flood_stops_at_the_limit(lab01, tmp_path):
    result, by_name, _ = run_fault(lab01, "output_flood", ["ar"], tmp_path)
    assert_failed(by_name["ar"], "output_limit", r"the limit is 4 MiB")


def test_memory_creep_is_stopped_by_the_watchdog(lab01, tmp_path):
    """Each rank stays under its own address-space limit; the tree's summed memory does not."""
    limits = dataclasses.replace(LIMITS, total_memory_mb=1200)
    result, by_name, _ = run_fault(lab01, "memory_creep", ["ar"], tmp_path, limits=limits)
    assert_failed(by_name["ar"], "memory_limit", r"the limit is 1,200 MiB")


def test_disk_bomb_is_stopped_by_the_watchdog(lab01, tmp_path):
    """Files of 16 MiB without end, each under RLIMIT_FSIZE: the watchdog sums tmp/."""
    limits = dataclasses.replace(LIMITS, disk_mb=64)
    result, by_name, _ = run_fault(lab01, "disk_bomb", ["ar"], tmp_path, limits=limits)
    assert_failed(by_name["ar"], "disk_limit", r"the limits are 64 MiB")


def _pids_capped() -> bool:
    """A fork bomb is bounded: a pids cgroup, or RLIMIT_NPROC that applies (not plain root)."""
    group = PidsGroup.create(f"autograder-probe-{os.getpid()}", 8)
    if group is not None:
        group.kill_all()
        return True
    return os.geteuid() != 0 or sandbox_uid() is not None


@pytest.mark.skipif(not _pids_capped(),
                    reason="no pids cgroup and root: nothing bounds a fork bomb")
def test_fork_bomb_is_stopped_and_nothing_survives(lab01, tmp_path):
    result, by_name, _ = run_fault(lab01, "fork_bomb", ["ar"], tmp_path)
    assert_failed(by_name["ar"], "process_limit", r"processes")
    time.sleep(0.5)
    assert not _survivors(tmp_path)


def test_signals_cannot_leave_the_sandbox(lab01, tmp_path):
    """Where the grade cannot get a uid of its own (root, an interpreter strangers may not run),
    the ranks run as root: only Landlock's signal scope keeps kill() inside the sandbox."""
    if landlock_abi() < 6:
        pytest.skip("no Landlock signal scope (ABI < 6): the sandbox can signal its user's "
                    "processes")
    out = subprocess.run(["sh", "-c", "sleep 314.159 >/dev/null 2>&1 & echo $!"],
                         capture_output=True, text=True, check=True).stdout
    sentinel = psutil.Process(int(out))
    try:
        result, by_name, _ = run_fault(lab01, "signal_outside", ["ar", "tree"], tmp_path)
        assert sentinel.is_running() and sentinel.status() != psutil.STATUS_ZOMBIE
    finally:
        sentinel.kill()
        try:  # an orphan re-parented to this process (the runner makes it a subreaper)
            os.waitpid(sentinel.pid, 0)
        except ChildProcessError:
            pass
    assert_failed(by_name["ar"], "sandbox_violation", r"Operation not permitted",
                  r"signals to processes outside")


@pytest.mark.xfail(strict=True, reason="known gap: a rank can rebuild every rank's input from "
                   "the case's seed; the values judges do not ask for any traffic")
def test_values_without_communication_get_no_points(lab01, tmp_path):
    result, by_name, _ = run_fault(lab01, "recompute_from_seed", ["ar"], tmp_path)
    assert by_name["ar"].score == 0


def test_the_callers_own_children_keep_their_exit_status(lab01, tmp_path):
    """The runner reaps the sandbox's processes only: a child the caller started (and that died
    during the grade) still reports how it died."""
    mine = subprocess.Popen(["sleep", "30"])
    mine.kill()
    run_fault(lab01, "mistake_no_communication", ["ar"], tmp_path)
    assert mine.wait(timeout=5) == -9


def _is_subreaper() -> bool:
    was = ctypes.c_int(0)
    ctypes.CDLL(None).prctl(37, ctypes.byref(was), 0, 0, 0)  # PR_GET_CHILD_SUBREAPER
    return bool(was.value)


def test_the_caller_is_no_subreaper_after_a_grade(lab01, tmp_path):
    """The runner adopts the sandbox's orphans during a grade only: left a subreaper, the caller
    (a test session, an instructor's script) would collect zombies of every later daemon's
    orphaned grandchildren (SLURM's, found by test_slurm's teardown)."""
    assert not _is_subreaper()
    run_fault(lab01, "mistake_no_communication", ["ar"], tmp_path)
    assert not _is_subreaper()
    orphan = subprocess.run(["sh", "-c", "sleep 0.2 >/dev/null 2>&1 & echo $!"],
                            capture_output=True, text=True, check=True).stdout
    assert int(orphan) not in {p.pid for p in psutil.Process().children(recursive=True)}


def test_every_fault_file_has_a_test():
    tested = set(CASES) | {"syntax_error", "forged_results_cwd", "forged_results_abs",
                           "forged_results_tmp", "output_flood", "memory_creep", "fork_bomb",
                           "signal_outside", "recompute_from_seed", "disk_bomb"}
    assert {p.stem for p in FAULTS.glob("*.py")} == tested


_CHILD = """
import dataclasses, json, sys
from pathlib import Path
sys.path.insert(0, {root!r})
from autograder.grade import grade
from autograder.lab import find_lab, load_lab
from autograder.sandbox.limits import Limits
lab = load_lab(find_lab("01_collectives"), hidden=False)
case = {{"world_size": 2, "dtype": "float32", "seed": 0, "numel": 8}}
lab = dataclasses.replace(lab, checks=[
    dataclasses.replace(lab.checks[0], cases=(case,), timeout=60.0),
    dataclasses.replace(lab.checks[3], timeout=60.0)])
r = grade(lab, Path(sys.argv[1]), limits=Limits(wall_s=150, processes=64))
print(json.dumps([c.score for c in r.checks]))
"""


@pytest.mark.slow
def test_four_grades_at_once_do_not_interfere(tmp_path):
    """Four grader processes at the same time (each its own sandbox, cgroup and folder), each
    with its own submission: every one gets its own score."""
    subs = tmp_path / "submissions"
    expected = {REFERENCE: [10, 3],
                submission("mistake_averaged", subs): [0, 3],
                submission("mistake_linear_broadcast", subs): [10, 0],
                submission("exception_one_rank", subs): [0, 3]}
    script = tmp_path / "one_grade.py"
    script.write_text(_CHILD.format(root=str(ROOT)))
    procs = {path: subprocess.Popen([sys.executable, str(script), str(path)], cwd=tmp_path,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for path in expected}
    try:
        out = {path: p.communicate(timeout=240) for path, p in procs.items()}
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    for path, (stdout, stderr) in out.items():
        assert procs[path].returncode == 0, stderr[-2000:]
        assert json.loads(stdout.strip().splitlines()[-1]) == expected[path], (
            path.name, stderr[-500:])
