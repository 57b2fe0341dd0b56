"""The fault corpus: bad submissions of lab 01 that the grader must survive. Each file in
tests/faults/01_collectives/ holds only what its fault changes (a function redefined, a module
statement added); `faultkit.submission` appends it to the reference solution, so the later
definitions win and the rest of the file is the working lab. For each: a valid results.json,
zero on the checks the fault touches (the others still pass), the failure kind a student or
instructor filters on, a message that says where, and nothing left: no process anywhere on the
machine (`faultkit.survivors`), no folder (`faultkit.run_grade`), no child of this process
(the autouse fixture). The sandbox's attacks (issue 19) are in test_autograder_sandbox.py.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import subprocess
import sys

import psutil
import pytest
from faultkit import (FAULTS, LIMITS, REFERENCE, ROOT, assert_failed, assert_passed,
                      line_of, ring_lines, run_fault, source, submission, wait_gone)

from autograder.lab import Lab, find_lab, load_lab
from autograder.sandbox.cgroup import PidsGroup
from autograder.sandbox.limits import sandbox_uid


@pytest.fixture(scope="module")
def lab01() -> Lab:
    return load_lab(find_lab("01_collectives"), hidden=False)


# fault → (checks it runs, the checks that must fail with their kind, regexes the first failed
# check's message must match, checks given the short timeout). Unnamed checks must pass.
CASES = {
    "import_error": (["ar"], {"ar": "import_error"}, [r"nonexistent_pkg"], set()),
    "exception_one_rank": (["ar", "tree"], {"ar": "exception"},
                           [r"Rank 1 raised RuntimeError: rank 1 gives up", "LINE"], set()),
    "exit_one_rank": (["ar", "tree"], {"ar": "crash"}, [r"Rank 1 exited \(code 3\)"], set()),
    "segfault_one_rank": (["ar", "tree"], {"ar": "crash"}, [r"Rank 1 died from SIGSEGV", "LINE"],
                          set()),
    # Which call of the ring rank 0 was waiting in can be up to timing: the report names a line
    # of the ring (RING), whichever it was.
    "deadlock_skip": (["ar"], {"ar": "deadlock"},
                      [r"rank 0 in (send to|recv from) rank 1", r"collectives\.py line RING",
                       r"rank 1 had already returned", r"skips one or returns early"], {"ar"}),
    "deadlock_blocking_ring": (["ar"], {"ar": "deadlock"},
                               [r"rank 0 in send to rank 1", r"rank 1 in send to rank 0",
                                r"dist\.send\(send_buf"], {"ar"}),
    "mismatched_sizes": (["ar"], {"ar": "mismatch"},
                         [r"rank 0 sent 20 bytes \(5 float32\) to rank 1, whose receive holds "
                          r"16 bytes \(4 float32\)"], set()),
    "infinite_loop": (["ar"], {"ar": "timeout"},
                      [r"rank 0 at collectives\.py line LINE",
                       r"rank 1 in (send to|recv from) rank 0"],
                      {"ar"}),
    "sleep_forever": (["ar"], {"ar": "timeout"}, [r"rank 0 at collectives\.py line LINE"], {"ar"}),
    "memory_bomb": (["ar", "tree"], {"ar": "memory_limit"}, [r"can't allocate memory"], set()),
    "builtin_all_reduce": (["ar", "tree"], {"ar": "builtin_collective"},
                           [r"all_reduce", r"build it from send/recv"], set()),
    "hidden_builtin": (["ar", "tree"], {"ar": "builtin_collective"},
                       [r"Rank \d called torch's built-in all_reduce", r"send/recv"], set()),
    "forbidden_import": (["ar"], {"ar": "forbidden_import"}, [r"toolkit\.collectives"], set()),
    # Not in a rank's world at all (issue 30): no such file there.
    "read_reference": (["ar"], {"ar": "sandbox_violation"},
                       [r"No such file or directory: '.*labs/01_collectives/collectives\.py'",
                        r"world holds only"], set()),
    "read_hidden_checks": (["ar", "tree"], {"ar": "sandbox_violation"},
                           [r"No such file or directory: '.*hidden/checks\.py'"], set()),
    "patch_allclose": (["ar", "tree"], {"ar": "wrong_result"}, [r"own input"], set()),
    "patch_isend": (["bcast", "tree"], {"tree": "wrong_result"}, [r"linear broadcast"], set()),
    "patch_recorder": (["tree"], {"tree": "wrong_result"}, [r"linear broadcast, not a tree"],
                       set()),
    # The fork server has no pid in a rank's pid namespace: nothing to signal.
    "forge_observations": (["ar", "tree"], {"ar": "sandbox_violation"},
                           [r"No such process", r"sees only its own processes"], set()),
    "root_capabilities": (["ar", "tree"], {"ar": "sandbox_violation"},
                          [r"Operation not permitted: '.*owned-"], set()),
    "recompute_from_seed": (["ar", "tree"], {"ar": "wrong_result"}, [r"wrong on ranks? "], set()),
    # The red team's traffic cheats: per-peer facts and unkept bytes, not counts alone.
    "hub_all_reduce": (["ring4", "tree"], {"ring4": "wrong_result"},
                       [r"rank 0 received 49,152 bytes", r"receives as much as it sends"],
                       set()),
    "chain_broadcast": (["bcast", "tree"], {"tree": "wrong_result"},
                        [r"in round 3", r"⌈log₂ 4⌉ = 2", r"chain"], set()),
    "tree_fanout": (["bcast", "tree"], {"tree": "wrong_result"},
                    [r"got the tensor in round 3", r"⌈log₂ 4⌉ = 2 rounds"], set()),
    "keep_starved": (["ring", "ar"], {"ring": "wrong_result"},
                     [r"could not be checked", r"keeps per launch \(64 MiB\)"], set()),
    # The second red team's forged frames, which crashed the grader (a TypeError in torch).
    "frame_overflow_op": (["ar", "bcast"], {"bcast": "tampering"}, [r"does not accept"], set()),
    "frame_overflow_output": (["ar", "bcast"], {"bcast": "tampering"},
                              [r"does not accept", r"bad shape"], set()),
    "frame_unhashable_dtype": (["ar", "bcast"], {"bcast": "tampering"}, [r"does not accept"],
                               set()),
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
# How many lines from there the spot may be: a spinning `while rank == 0: pass` is caught on
# either of its two lines, whichever the interpreter was executing when the grader looked.
SPANS = {"infinite_loop": 2}


def line_pattern(fault: str) -> str:
    """A regex for the line(s) the fault's message must name ("" for a fault without one)."""
    if fault not in LINES:
        return ""
    first = line_of(fault, LINES[fault])
    return "(" + "|".join(str(first + i) for i in range(SPANS.get(fault, 1))) + ")"


@pytest.mark.parametrize("fault", sorted(CASES))
def test_fault_is_named_and_zeroed(lab01, fault, tmp_path):
    names, failing, says, hang = CASES[fault]
    result, by_name = run_fault(lab01, fault, names, tmp_path, hang=hang)
    if fault == "forge_observations" and by_name["ar"].kind == "wrong_result":
        # The forged output frame and the refused kill's error frame race to the judge: on a
        # loaded machine the forged output can be judged first. Either way it earns nothing: it
        # is judged as what it is, the rank's own input.
        failing, says = {"ar": "wrong_result"}, [r"own input"]
    line = line_pattern(fault)
    first = next(n for n in names if n in failing)
    says = [s.replace("LINE", line).replace("RING", ring_lines(fault)) for s in says]
    assert_failed(by_name[first], failing[first], *says)
    for name in names:
        if name in failing:
            assert_failed(by_name[name], failing[name])
        else:
            assert_passed(by_name[name])


def test_syntax_error_is_found_before_anything_runs(lab01, tmp_path):
    result, by_name = run_fault(lab01, "syntax_error", ["ar", "tree"], tmp_path)
    line = line_of("syntax_error", "(rank - 1 % p")
    # Said once, for the grade (report.to_text prints it above the checks), not per check.
    assert result.problem.kind == "syntax_error"
    assert re.search(rf"collectives\.py line {line}: .*never closed", result.problem.message)
    for check in result.checks:
        assert_failed(check, "syntax_error", r"^Not run")
    assert result.sandbox == ""  # parsed here, no sandbox started


def test_forged_results_in_tmp_stay_in_the_rank(lab01, tmp_path):
    """$TMPDIR is the one folder a rank may write, a tmpfs in its own world that nothing outside
    sees and that ends with it (issue 30): a results.json there reaches no one. The check whose
    work it skipped fails; the others keep their points."""
    result, by_name = run_fault(lab01, "forged_results_tmp", ["ar", "tree"], tmp_path)
    assert_failed(by_name["ar"], "wrong_result")
    assert_passed(by_name["tree"])
    assert not list((tmp_path / "runs").rglob("results.json"))


def test_forged_results_in_its_folder_are_refused(lab01, tmp_path):
    result, by_name = run_fault(lab01, "forged_results_cwd", ["ar", "tree"], tmp_path)
    assert_failed(by_name["ar"], "forged_results", r"Read-only file system: 'results\.json'")
    assert_passed(by_name["tree"])


def test_forged_results_outside_its_folder_are_refused(lab01, tmp_path):
    """The fault writes into the folders above its own: the grade's, then `runs/`."""
    result, by_name = run_fault(lab01, "forged_results_abs", ["ar", "tree"], tmp_path)
    assert not (tmp_path / "runs" / "results.json").exists()
    assert_failed(by_name["ar"], "forged_results", r"Read-only file system: '.*results\.json'")
    assert_passed(by_name["tree"])


def test_output_flood_costs_only_its_check(lab01, tmp_path):
    """100 MB printed in ring_all_reduce: stopped at the 4 MiB limit (the grader counts every
    read and reads no more past it: at most one 64 KiB read over), and the checks
    that never call it still pass (a limit costs its own check only)."""
    result, by_name = run_fault(lab01, "output_flood", ["ar", "tree", "ag"], tmp_path)
    assert_failed(by_name["ar"], "output_limit", r"the limit is 4 MiB")
    printed = float(re.search(r"printed ([\d.]+) MiB", by_name["ar"].message).group(1))
    assert 4 <= printed <= 4.3  # one 64 KiB read past the limit at most (and rounding)
    assert_passed(by_name["tree"])
    assert_passed(by_name["ag"])
    assert any("output_limit" in note for note in result.notes)


def test_memory_creep_costs_only_its_check(lab01, tmp_path):
    """Each rank stays under its own address-space limit; the ranks together do not. The
    checks that never call the function keep their points."""
    limits = LIMITS.__class__(**{**LIMITS.__dict__, "total_memory_mb": 1200})
    result, by_name = run_fault(lab01, "memory_creep", ["ar", "tree", "ag"], tmp_path,
                                limits=limits)
    assert_failed(by_name["ar"], "memory_limit", r"the limit is 1,200 MiB")
    assert_passed(by_name["tree"])
    assert_passed(by_name["ag"])


def test_disk_bomb_costs_only_its_check(lab01, tmp_path):
    """Files of 16 MiB without end, each under RLIMIT_FSIZE: the launch's folders hold at most
    the disk limit (a tmpfs of that size as root, the watchdog's sum otherwise)."""
    limits = LIMITS.__class__(**{**LIMITS.__dict__, "disk_mb": 64})
    result, by_name = run_fault(lab01, "disk_bomb", ["ar", "tree"], tmp_path, limits=limits)
    assert_failed(by_name["ar"], "disk_limit", r"the limits are 64 MiB")
    assert_passed(by_name["tree"])


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
    result, by_name = run_fault(lab01, "fork_bomb", ["ar", "tree"], tmp_path)
    assert_failed(by_name["ar"], "process_limit", r"process")
    assert_passed(by_name["tree"])
    assert not wait_gone(tmp_path)  # a killed child's exit is seen later on a loaded machine


def test_signals_cannot_leave_the_sandbox(lab01, tmp_path):
    """A rank is pid 1 of a pid namespace of its own: the sentinel's pid names no process
    there (and Landlock's signal scope, and a uid of its own as root, would refuse it too)."""
    out = subprocess.run(["sh", "-c", "sleep 314.159 >/dev/null 2>&1 & echo $!"],
                         capture_output=True, text=True, check=True).stdout
    sentinel = psutil.Process(int(out))
    text = source("signal_outside").replace("SENTINEL_PID = 0", f"SENTINEL_PID = {sentinel.pid}")
    try:
        result, by_name = run_fault(lab01, "signal_outside", ["ar", "tree"], tmp_path, text=text)
        assert sentinel.is_running() and sentinel.status() != psutil.STATUS_ZOMBIE
    finally:
        sentinel.kill()
        try:  # an orphan re-parented to this process (were it still a subreaper)
            os.waitpid(sentinel.pid, 0)
        except ChildProcessError:
            pass
    assert_failed(by_name["ar"], "sandbox_violation", r"No such process",
                  r"sees only its own processes")


def test_limits_of_processes_outside_cannot_be_changed(lab01, tmp_path):
    """A rank that calls prlimit on a process outside the sandbox is refused (seccomp: prlimit64
    on the caller only) and the process keeps its limits."""
    out = subprocess.run(["sh", "-c", "sleep 271.828 >/dev/null 2>&1 & echo $!"],
                         capture_output=True, text=True, check=True).stdout
    sentinel = psutil.Process(int(out))
    before = sentinel.rlimit(psutil.RLIMIT_NOFILE)
    text = source("prlimit_outside").replace("SENTINEL_PID = 0", f"SENTINEL_PID = {sentinel.pid}")
    try:
        result, by_name = run_fault(lab01, "prlimit_outside", ["ar"], tmp_path, text=text)
        assert sentinel.rlimit(psutil.RLIMIT_NOFILE) == before
    finally:
        sentinel.kill()
        try:
            os.waitpid(sentinel.pid, 0)
        except ChildProcessError:
            pass
    assert_failed(by_name["ar"], "sandbox_violation", r"Operation not permitted")


def test_the_callers_own_children_keep_their_exit_status(lab01, tmp_path):
    """The grader reaps the sandbox's processes only: a child the caller started (and that
    died during the grade) still reports how it died."""
    mine = subprocess.Popen(["sleep", "30"])
    mine.kill()
    run_fault(lab01, "mistake_no_communication", ["ar"], tmp_path)
    assert mine.wait(timeout=5) == -9


def _is_subreaper() -> bool:
    was = ctypes.c_int(0)
    ctypes.CDLL(None).prctl(37, ctypes.byref(was), 0, 0, 0)  # PR_GET_CHILD_SUBREAPER
    return bool(was.value)


def test_the_caller_is_no_subreaper_after_a_grade(lab01, tmp_path):
    """The grader adopts the sandbox's orphans during a grade only: left a subreaper, the caller
    (a test session, an instructor's script) would collect zombies of every later daemon's
    orphaned grandchildren (SLURM's, found by test_slurm's teardown)."""
    assert not _is_subreaper()
    run_fault(lab01, "mistake_no_communication", ["ar"], tmp_path)
    assert not _is_subreaper()
    orphan = subprocess.run(["sh", "-c", "sleep 0.2 >/dev/null 2>&1 & echo $!"],
                            capture_output=True, text=True, check=True).stdout
    assert int(orphan) not in {p.pid for p in psutil.Process().children(recursive=True)}


def test_every_fault_file_has_a_test():
    from test_autograder_isolation import ISOLATION_FAULTS
    from test_autograder_memory import MEMORY_FAULTS
    from test_autograder_sandbox import SANDBOX_FAULTS

    tested = set(CASES) | set(SANDBOX_FAULTS) | set(MEMORY_FAULTS) | ISOLATION_FAULTS | {
        "syntax_error", "forged_results_cwd", "forged_results_abs", "forged_results_tmp",
        "output_flood", "memory_creep", "fork_bomb", "signal_outside", "disk_bomb",
        "prlimit_outside"}
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
r = grade(lab, Path(sys.argv[1]), limits=Limits(wall_s=200, processes=64))
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
        out = {path: p.communicate(timeout=280) for path, p in procs.items()}
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    for path, (stdout, stderr) in out.items():
        assert procs[path].returncode == 0, stderr[-2000:]
        assert json.loads(stdout.strip().splitlines()[-1]) == expected[path], \
            (path.name, stderr[-500:])

