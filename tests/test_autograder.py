"""The autograder's core: the reference passes, the student edition holds no solution and its
stubs fail, results.json follows Gradescope's fields, feedback names the usual mistakes, the
sandbox confines files, and the CLI's commands work. (Bad submissions: test_autograder_faults.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
import torch

from autograder.cli import main as cli
from autograder.feedback import compare_outputs
from autograder.grade import grade
from autograder.lab import find_lab, load_lab
from autograder.release import MarkerError, release_lab, solution_lines, strip_solutions
from autograder.report import validate_results, write_results
from autograder.sandbox import landlock
from notebooks import execute

ROOT = Path(__file__).resolve().parents[1]
LAB_DIR = ROOT / "labs" / "01_collectives"
LABS = sorted(p.parent.name for p in (ROOT / "labs").glob("*/checks.py"))
"""Every lab: its reference must pass, its release must leak nothing and its stubs must fail."""


def _student_file(lab_dir: Path) -> Path:
    return lab_dir / load_lab(lab_dir, hidden=False).info.student_files[0]


@pytest.fixture(scope="module")
def lab():
    return load_lab(find_lab("01_collectives"))


@pytest.fixture(scope="module")
def releases(tmp_path_factory):
    out = tmp_path_factory.mktemp("release")
    return {name: out / name for name in LABS if release_lab(ROOT / "labs" / name, out / name)}


@pytest.fixture(scope="module")
def released(releases):
    return releases["01_collectives"]


def test_every_lab_is_found():
    assert {"01_collectives", "04_pipeline_schedule"} <= set(LABS)


@pytest.mark.multirank
@pytest.mark.parametrize("name", LABS)
def test_reference_scores_full_marks_with_a_valid_results_json(name, tmp_path):
    lab_dir = ROOT / "labs" / name
    result = grade(load_lab(lab_dir), _student_file(lab_dir))
    assert [(c.check.name, c.message) for c in result.checks if not c.ok] == []
    assert result.score == result.max_score == 100
    data = write_results(result, tmp_path / "results.json")
    assert validate_results(json.loads((tmp_path / "results.json").read_text())) == []
    assert {t["visibility"] for t in data["tests"]} == {"visible", "after_published"}
    visible = sum(t["max_score"] for t in data["tests"] if t["visibility"] == "visible")
    assert visible == 40, "visible checks carry 40 of 100 points, hidden ones the rest"
    assert "landlock" in result.sandbox or landlock.abi_version() == 0


@pytest.mark.parametrize("name", LABS)
def test_release_holds_no_solution_and_no_hidden_checks(name, releases):
    released, lab_dir = releases[name], ROOT / "labs" / name
    text = "".join(p.read_text() for p in released.rglob("*") if p.is_file())
    assert not (released / "hidden").exists()
    assert "BEGIN SOLUTION" not in text and "END SOLUTION" not in text
    assert "For instructors" not in text
    leaked = [line for line in solution_lines(lab_dir) if line in text]
    assert solution_lines(lab_dir), "the reference has solution regions"
    assert leaked == []
    n_regions = _student_file(lab_dir).read_text().count("### BEGIN SOLUTION")
    assert text.count('raise NotImplementedError("your code here")') == n_regions
    assert "# Hint:" in text


@pytest.mark.multirank
@pytest.mark.parametrize("name", LABS)
def test_release_stubs_fail_every_visible_check(name, releases):
    released = releases[name]
    stub_lab = load_lab(released)  # the student edition: visible checks only
    assert not stub_lab.hidden_loaded and all(c.visible for c in stub_lab.checks)
    result = grade(stub_lab, _student_file(released))
    assert result.score == 0
    assert {c.kind for c in result.checks} == {"not_implemented"}


def test_solution_markers_must_pair_up():
    with pytest.raises(MarkerError, match="never closed"):
        strip_solutions("x = 1\n### BEGIN SOLUTION\ny = 2\n", "f.py")
    with pytest.raises(MarkerError, match="without"):
        strip_solutions("### END SOLUTION\n", "f.py")
    text, n = strip_solutions("def f():\n    ### BEGIN SOLUTION\n    return 1\n"
                              "    ### END SOLUTION\n    ### HINT: return one\n")
    assert n == 1 and "return 1" not in text
    assert "    # Hint: return one\n    raise NotImplementedError" in text


def _t(*values):
    return torch.tensor(values, dtype=torch.float32)


@pytest.mark.parametrize("outputs, message", [
    ([_t(2, 3), _t(2, 3)], "averaged instead of summed"),
    ([_t(1, 2), _t(3, 4)], "still the rank's own input"),
    ([_t(4, 6), _t(3, 4)], "right only on rank 0"),
    ([_t(6, 4), _t(6, 4)], "wrong order"),
    ([_t(4, 6), _t(4, 7)], "rank 1: on rank 1, element 1 is 7, expected 6"),
])
def test_feedback_names_the_usual_mistakes(outputs, message):
    inputs, total = [_t(1, 2), _t(3, 4)], _t(4, 6)
    verdict = compare_outputs(outputs, [total, total], world_size=2, inputs=inputs,
                              bounds=[(0, 1), (1, 2)])
    assert not verdict.passed
    assert message in verdict.message.replace("ranks 1", "rank 1")


def test_results_validation_catches_bad_fields():
    assert validate_results({"score": 1, "execution_time": 0, "output": "", "tests": [
        {"name": "a", "score": 2, "max_score": 1, "status": "ok", "output": "",
         "visibility": "sometimes"}]})  # score > max, bad status, bad visibility, sum ok


@pytest.mark.skipif(landlock.abi_version() < 1, reason="this kernel has no Landlock")
def test_landlock_confines_reads_and_writes(tmp_path):
    """A rank's rules: it reads its code folder and writes its own folder (plain files only)
    and /dev/null; not a file beside them, not the lab, not /dev/shm, not a device node, not
    /etc/shadow; no symbolic link or FIFO, even in its own folder."""
    secret, code, home = tmp_path / "secret.txt", tmp_path / "code", tmp_path / "home"
    secret.write_text("answer")
    code.mkdir()
    (code / "mine.py").write_text("x = 1")
    home.mkdir()
    script = f"""
import os
from pathlib import Path
from autograder.sandbox import landlock
from autograder.sandbox.paths import rank_paths
read, write, listing = rank_paths(Path({str(code)!r}), Path({str(home)!r}))
landlock.restrict(read, write, listing, write_rights=landlock.WRITE_PLAIN, tcp=False)
actions = [lambda: open({str(secret)!r}).read(),
           lambda: open({str(tmp_path / 'forged.json')!r}, 'w'),
           lambda: open({str(LAB_DIR / 'collectives.py')!r}).read(),
           lambda: open('/dev/shm/grade-probe', 'w'), lambda: open('/dev/tty0', 'w'),
           lambda: open('/etc/shadow').read(),
           lambda: os.symlink('/etc/passwd', {str(home / 'link')!r}),
           lambda: os.mkfifo({str(home / 'fifo')!r})]
for action in actions:
    try:
        action(); print("allowed")
    except (PermissionError, FileNotFoundError):
        print("denied")
open({str(home / 'ok.txt')!r}, "w").write("fine")
open('/dev/null', 'w').write('x')
print(open({str(code / 'mine.py')!r}).read().replace(' ', ''))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["denied"] * 8 + ["x=1"], out.stderr
    assert (home / "ok.txt").read_text() == "fine"
    assert not (home / "link").exists() and not (home / "fifo").exists()


def test_cli_reports_bad_arguments_with_exit_status_2(tmp_path, capsys):
    assert cli(["grade", str(tmp_path / "missing.py")]) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "x.py").write_text("pass\n")
    assert cli(["grade", str(tmp_path / "x.py")]) == 2
    assert "--lab" in capsys.readouterr().err
    assert cli(["grade", str(tmp_path / "x.py"), "--lab", "99_nope"]) == 2
    assert "01_collectives" in capsys.readouterr().err  # lists the labs there are
    (tmp_path / "out").mkdir()
    assert cli(["release", "--lab", "01_collectives", "--out", str(tmp_path / "out")]) == 2
    assert "--force" in capsys.readouterr().err


def test_cli_grades_a_syntax_error_without_starting_ranks(tmp_path, capsys):
    bad = tmp_path / "collectives.py"
    bad.write_text("def ring_all_reduce(t:\n    return t\n")
    assert cli(["grade", str(bad), "--lab", "01_collectives", "--json",
                str(tmp_path / "r.json"), "--no-color"]) == 0
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["score"] == 0 and validate_results(data) == []
    assert {t["extra_data"]["kind"] for t in data["tests"]} == {"syntax_error"}
    assert "line 1" in capsys.readouterr().out


def test_gradescope_bundle_follows_the_specification(tmp_path):
    assert cli(["gradescope", "--lab", "01_collectives", "--out", str(tmp_path / "ag.zip")]) == 0
    with zipfile.ZipFile(tmp_path / "ag.zip") as zf:
        names = set(zf.namelist())
        modes = {i.filename: i.external_attr >> 16 for i in zf.infolist()}
        run = zf.read("run_autograder").decode()
    assert {"setup.sh", "run_autograder", "pyproject.toml", "labs/01_collectives/hidden/checks.py",
            "autograder/cli.py", "toolkit/launch/launcher.py"} <= names
    assert modes["setup.sh"] & 0o111 and modes["run_autograder"] & 0o111
    assert "/autograder/results/results.json" in run and "/autograder/submission" in run


@pytest.mark.multirank
@pytest.mark.slow
def test_batch_grades_a_folder_with_a_summary(tmp_path, released):
    subs = tmp_path / "subs"
    for name, src in (("alice", LAB_DIR / "collectives.py"), ("bob", released / "collectives.py")):
        (subs / name).mkdir(parents=True)
        (subs / name / "collectives.py").write_bytes(src.read_bytes())
    out = subprocess.run([sys.executable, "-m", "autograder", "batch", str(subs), "--lab",
                          "01_collectives", "--jobs", "2", "--out", str(tmp_path / "graded")],
                         capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    rows = (tmp_path / "graded" / "summary.csv").read_text().splitlines()
    assert rows[1].startswith("alice,100.0,100,") and rows[2].startswith("bob,0.0,100,")
    assert "2/2" in out.stderr
    for name in ("alice", "bob"):
        data = json.loads((tmp_path / "graded" / name / "results.json").read_text())
        assert validate_results(data) == []


@pytest.mark.multirank
@pytest.mark.parametrize("name", LABS)
def test_playground_runs_the_reference(name):
    pytest.importorskip("nbclient")
    import nbformat

    lab_dir = ROOT / "labs" / name
    nb = nbformat.read(lab_dir / "playground.ipynb", as_version=4)
    execute(nb, lab_dir, timeout=120)
    text = "".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", []))
    for sign in ("WRONG", "not written yet", "cannot draw", "Error"):
        assert sign not in text, f"{name}'s playground printed {sign!r} on the reference"
    assert any(o.get("output_type") == "display_data"
               for c in nb.cells for o in c.get("outputs", []))


_TINY_HARNESS = '''
import torch
from toolkit.models import TinyMLP

def make_inputs(case, world_size):
    return [torch.full((4,), float(r)) for r in range(world_size)]

def _call(student, call):
    TinyMLP(seed=0)  # readable only because LabInfo.sandbox_modules names "models"
    t = call.inputs
    student.total(t)
    return t

CALLS = {"total": _call}
'''

_TINY_CHECKS = '''
import torch
from autograder.lab import Check, LabInfo, Verdict

LAB = LabInfo(slug="tiny", title="tiny", student_files=("mine.py",), names=("total",),
              allowed_collectives=("all_reduce",), sandbox_modules=("models",))

def judge(r):
    want = sum(r.inputs)
    ok = all(torch.equal(o, want) for o in r.outputs)
    calls = r.traffic[0].calls
    return Verdict(ok and calls == {"all_reduce": 1}, f"calls {calls}")

CHECKS = [Check("total", 1, "total", ({"world_size": 2},), judge)]
'''


@pytest.mark.multirank
def test_a_lab_may_allow_collectives_and_toolkit_modules(tmp_path):
    lab_dir = tmp_path / "tiny"
    lab_dir.mkdir()
    (lab_dir / "harness.py").write_text(_TINY_HARNESS)
    (lab_dir / "checks.py").write_text(_TINY_CHECKS)
    good, bad = tmp_path / "good" / "mine.py", tmp_path / "bad" / "mine.py"
    good.parent.mkdir(), bad.parent.mkdir()
    good.write_text("import torch.distributed as dist\ndef total(t):\n    dist.all_reduce(t)\n")
    bad.write_text("import torch.distributed as dist\ndef total(t):\n"
                   "    dist.all_reduce(t)\n    dist.broadcast(t, 0)\n")
    lab = load_lab(lab_dir)
    assert grade(lab, good).score == 1
    result = grade(lab, bad)
    assert result.score == 0 and result.checks[0].kind == "builtin_collective"
    message = result.checks[0].message
    assert "broadcast" in message and "allows all_reduce" in message


def test_sigterm_stops_a_grade_and_leaves_nothing(tmp_path):
    """A batch's timeout or SLURM's scancel sends SIGTERM: the grader unwinds (its ranks and
    fork server stopped, its grade folder removed), writes a zero results.json that says it was
    stopped, and exits with 128 + 15. The submission's rank 0 sleeps inside the first check, so
    the grade is mid-launch when the signal comes (we wait for a rank seen in two polls in a row,
    whatever the time that takes)."""
    from faultkit import submission, survivors, wait_gone

    sub = submission("sleep_forever", tmp_path / "subs")
    work = tmp_path / "tmp"
    work.mkdir()
    out = tmp_path / "results.json"
    env = {**os.environ, "TMPDIR": str(work)}
    proc = subprocess.Popen([sys.executable, "-m", "autograder", "grade", str(sub.parent),
                             "--lab", "01_collectives", "--json", str(out), "--no-hidden"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # One poll's list is the evidence: polling again could land between two checks' ranks
        # and call a running grade "never started". A rank seen in two polls in a row says the
        # launches have begun (here, the first two checks sleep to their timeout); wherever in
        # the grade the signal then lands, it must unwind the same way.
        before, lasting = set(), set()
        for _ in range(2400):  # up to 240 s for the ranks to start on a busy machine
            now = {line.split()[0] for line in survivors(work)}
            lasting = before & now
            if lasting or proc.poll() is not None:
                break
            before = now
            time.sleep(0.1)
        assert proc.poll() is None and lasting, "the grade's ranks never started"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert not list(work.glob("grade-*"))
    assert not wait_gone(work)
    results = json.loads(out.read_text())
    assert results["score"] == 0 and "stopped (SIGTERM)" in results["output"]


def test_batch_stops_a_grade_past_its_time_and_leaves_nothing(tmp_path, monkeypatch):
    """The batch's per-grade timeout sends SIGTERM (then SIGKILL after a grace): whenever it
    lands (while the grader starts, or mid-launch), the submission gets a zero results.json and
    no grade folder or rank survives."""
    from faultkit import submission, wait_gone

    from autograder.batch import _grade_one

    sub = submission("sleep_forever", tmp_path / "subs")
    work = tmp_path / "tmp"
    work.mkdir()
    monkeypatch.setenv("TMPDIR", str(work))
    _, data, _ = _grade_one(sub.parent, find_lab("01_collectives"), tmp_path / "out", timeout=8)
    assert data["score"] == 0
    assert "ran past 8 s" in (tmp_path / "out" / "sleep_forever" / "report.txt").read_text()
    assert not list(work.glob("grade-*"))
    assert not wait_gone(work)


def test_a_grade_stopped_while_its_folder_is_made_leaves_no_folder(tmp_path, monkeypatch):
    """A SIGTERM becomes an exception (cli's Stopped) wherever the grader is: one raised while
    the grade folder is being filled, or just after it exists and before the ranks start,
    leaves no grade-* folder behind."""
    import autograder.grade as grading

    with pytest.raises(FileNotFoundError):  # a file that cannot be written: the copy fails
        grading.prepare_workdir({"ok.py": b"", "no/such/folder.py": b""}, tmp_path)
    assert list(tmp_path.iterdir()) == []

    def stopped(**_):
        raise KeyboardInterrupt  # as a signal handler's exception would, right after the folder

    monkeypatch.setattr(grading, "Job", stopped)
    lab = load_lab(ROOT / "labs" / "01_collectives", hidden=False)
    with pytest.raises(KeyboardInterrupt):
        grade(lab, ROOT / "labs" / "01_collectives" / "collectives.py", workbase=tmp_path)
    assert list(tmp_path.iterdir()) == []
