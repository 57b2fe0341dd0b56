"""What `grade` grades and how it says so: the file only where the lab says it is (several
refused, none named with where it looked), the file graded named in the report, a wrong file, a
binary file or a syntax error said once in one line naming the right file; a copy of a lab
graded with the installation's full checks; `batch` on a missing folder or into an earlier
--out. Red team 8's files: a link anywhere from the submission down (to the reference, to a
root-only file, to /proc) refused before anything is read, a file read only if regular,
non-blocking and small; a folder with its own checks.py graded without --lab refused, nothing
of it run. (Which mistakes the checks name: test_autograder_faults.py.)"""

from __future__ import annotations

import csv
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from faultkit import run_grade, small_lab

from autograder.cli import main as cli
from autograder.lab import load_lab
from autograder.release import release_lab
from autograder.report import to_results_json, to_text
from autograder.submission import MAX_SOURCE_BYTES, locate, parse_problem, read_sources

ROOT = Path(__file__).resolve().parents[1]
LAB = ROOT / "labs" / "01_collectives"
FILES, SLUGS = ("collectives.py",), ("01_collectives",)


def test_the_file_is_taken_only_where_a_lab_file_can_be(tmp_path):
    (tmp_path / "deep" / "er").mkdir(parents=True)
    (tmp_path / "deep" / "er" / "collectives.py").write_text("x = 1\n")
    found, problem = locate(FILES, SLUGS, tmp_path)   # /tmp's case: another user's file below
    assert found == {} and problem.kind == "missing_file"
    assert str(tmp_path / "collectives.py") in problem.message
    (tmp_path / "labs" / "01_collectives").mkdir(parents=True)
    nested = tmp_path / "labs" / "01_collectives" / "collectives.py"
    nested.write_text("x = 2\n")
    assert locate(FILES, SLUGS, tmp_path) == ({"collectives.py": nested.resolve()}, None)
    (tmp_path / "collectives.py").write_text("x = 3\n")
    found, problem = locate(FILES, SLUGS, tmp_path)
    assert found == {} and problem.kind == "ambiguous_file"
    assert str(nested.resolve()) in problem.message and "remove the others" in problem.message


def test_a_missing_file_found_one_level_down_is_pointed_to(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "collectives.py").write_text("x = 1\n")
    found, problem = locate(FILES, SLUGS, tmp_path)
    assert found == {} and f"Found {tmp_path / 'mine' / 'collectives.py'}" in problem.message


def test_a_single_file_must_be_python(tmp_path):
    alice = tmp_path / "alice.py"
    alice.write_text("x = 1\n")
    assert locate(FILES, SLUGS, alice) == ({"collectives.py": alice}, None)
    readme = tmp_path / "README.md"
    readme.write_text("# Lab\n")
    found, problem = locate(FILES, SLUGS, readme)
    assert found == {} and "is not collectives.py: grade the file you edited" in problem.message


def test_binary_and_syntax_errors_are_one_message_naming_the_file():
    binary = parse_problem({"collectives.py": b"\x7fELF\x00\x00"})
    assert binary.kind == "syntax_error" and "None" not in binary.message
    assert binary.message.startswith("collectives.py is not Python source (it holds null bytes")
    broken = parse_problem({"collectives.py": b"x = 1\ndef f(:\n"})
    assert broken.message.startswith("Syntax error in collectives.py line 2:")
    assert parse_problem({"collectives.py": b"x = 1\n"}) is None


def _grade(capsys, *args) -> tuple[int, str]:
    status = cli(["grade", *map(str, args), "--no-color"])
    out = capsys.readouterr()
    return status, out.out + out.err


def test_a_syntax_error_is_said_once_above_the_checks(tmp_path, capsys):
    bad = tmp_path / "collectives.py"
    bad.write_text("def ring_all_reduce(t:\n    return t\n")
    status, report = _grade(capsys, bad, "--lab", "01_collectives", "--json",
                            tmp_path / "r.json")
    assert status == 0
    assert report.count("was never closed") == 1 and f"Graded collectives.py: {bad}" in report
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["output"].count("was never closed") == 1
    assert all("never closed" not in t["output"] for t in data["tests"])


def test_grading_a_labs_readme_names_the_file_to_grade(capsys):
    status, report = _grade(capsys, LAB / "README.md")   # no --lab: its folder is the lab
    assert status == 0
    assert report.count("is not collectives.py") == 1 and "Graded" not in report


@pytest.mark.multirank
def test_a_copy_of_a_lab_is_graded_with_the_installations_hidden_checks(tmp_path, capsys):
    copy = tmp_path / "01_collectives"
    release_lab(LAB, copy)                 # what `make lab` puts in the workspace
    assert not (copy / "hidden").exists()
    status, report = _grade(capsys, copy)
    assert status == 0 and "(hidden)" in report and "0 / 100 points" in report
    assert f"Graded collectives.py: {copy.resolve() / 'collectives.py'}" in report


def test_batch_on_a_missing_folder_is_one_line(tmp_path, capsys):
    assert cli(["batch", str(tmp_path / "nowhere"), "--lab", "01_collectives"]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        f"autograder batch: {tmp_path / 'nowhere'} does not exist: give the folder that holds "
        "the submissions (one sub-folder or .py file each)"]


@pytest.mark.slow
def test_batch_into_an_earlier_out_keeps_its_rows(tmp_path):
    out = tmp_path / "graded"
    out.mkdir()
    with open(out / "summary.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["submission", "score", "max_score"])
        writer.writeheader()
        writer.writerows([{"submission": "alice", "score": 100.0, "max_score": 100},
                          {"submission": "bob", "score": 40.0, "max_score": 100}])
    subs = tmp_path / "subs"
    (subs / "bob").mkdir(parents=True)     # bob hands in again: nothing, this time
    done = subprocess.run([sys.executable, "-m", "autograder", "batch", str(subs), "--lab",
                           "01_collectives", "--jobs", "1", "--out", str(out)],
                          capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert "kept 1 earlier row(s)" in done.stderr
    with open(out / "summary.csv", newline="") as f:
        rows = {r["submission"]: r for r in csv.DictReader(f)}
    assert sorted(rows) == ["alice", "bob"] and float(rows["alice"]["score"]) == 100
    assert float(rows["bob"]["score"]) == 0 and rows["bob"]["failures"] == "missing_file"


def _solution_lines() -> list[str]:
    """The reference's solution lines (between its markers) long enough to be its own."""
    lines, inside = [], False
    for line in (LAB / "collectives.py").read_text().splitlines():
        inside = (inside or "### BEGIN SOLUTION" in line) and "### END SOLUTION" not in line
        if inside and len(line.strip()) > 24 and "###" not in line:
            lines.append(line.strip())
    return lines


@pytest.mark.parametrize("target", ["reference", "/etc/shadow", "/proc/self/pagemap"])
def test_a_linked_student_file_is_refused_before_anything_is_read(target, tmp_path):
    """Red team 8: a link to the instructor's reference scored 100 (the grader reads as root),
    one to /etc/shadow had its first line quoted, one to the grader's own pagemap crashed it.
    Each is refused as a link: no rank starts, nothing of the target reaches the report."""
    real = LAB / "collectives.py" if target == "reference" else Path(target)
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / "collectives.py").symlink_to(real)
    lab = small_lab(load_lab(LAB, hidden=False), ["ar", "tree"])
    result, _ = run_grade(lab, sub, tmp_path)
    assert result.problem.kind == "missing_file" and result.score == 0
    assert "is a symbolic link" in result.problem.message and "follows no links" in \
        result.problem.message
    assert result.sandbox == "" and all(c.kind == "missing_file" for c in result.checks)
    said = to_text(result) + json.dumps(to_results_json(result))
    secret = _solution_lines() if target == "reference" else \
        [line for line in _readable_lines(real)[:1] if line.strip()]
    assert [line for line in secret if line in said] == []


def _readable_lines(path: Path) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()
    except OSError:
        return []


@pytest.mark.parametrize("linked", ["labs", "01_collectives"])
def test_a_linked_labs_or_lab_folder_is_refused(linked, tmp_path):
    """`FOLDER/labs/01_collectives/collectives.py` and `FOLDER/01_collectives/...` are places a
    lab's file may be: a link on the way (here to this project's own labs, reference included)
    is refused like a linked file; so is a batch entry that is itself a link."""
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / linked).symlink_to(LAB.parent if linked == "labs" else LAB)
    found, problem = locate(FILES, SLUGS, sub)
    assert found == {} and problem.kind == "missing_file"
    assert f"{sub / linked}" in problem.message and "is a symbolic link" in problem.message
    entry = tmp_path / "batch" / "alice"
    entry.parent.mkdir()
    entry.symlink_to(LAB)
    found, problem = locate(FILES, SLUGS, entry)
    assert found == {} and "is a symbolic link" in problem.message


def test_a_link_to_proc_kmsg_ends_at_once(tmp_path):
    """Red team 8: reading the link blocked the grader (as root, eating kernel log lines)
    past a 10 s budget. Now it is refused before any read, no rank runs, and results.json
    says which file to submit; the child's own timeout only bounds a regression."""
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / "collectives.py").symlink_to("/proc/kmsg")
    done = subprocess.run([sys.executable, "-m", "autograder", "grade", str(sub), "--lab",
                           "01_collectives", "--no-hidden", "--timeout", "600", "--json",
                           str(tmp_path / "r.json")],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["score"] == 0 and data["extra_data"]["sandbox"] == ""
    assert {t["extra_data"]["kind"] for t in data["tests"]} == {"missing_file"}
    assert "/proc/kmsg" not in data["output"] and "is a symbolic link" in data["output"]


def test_a_file_is_read_only_if_regular_small_and_ready(tmp_path, monkeypatch):
    fifo = tmp_path / "collectives.py"
    os.mkfifo(fifo)  # open for reading without a writer: a blocking open or read would hang
    files, problem = read_sources({"collectives.py": fifo})
    assert files == {} and "is not a regular file" in problem.message
    link = tmp_path / "link.py"
    link.symlink_to(LAB / "collectives.py")
    assert "cannot be read" in read_sources({"c": link})[1].message  # O_NOFOLLOW
    big = tmp_path / "big.py"
    with open(big, "wb") as f:
        f.truncate(MAX_SOURCE_BYTES + 1)  # sparse: nothing of it is read
    assert "over the 4 MiB a lab file may have" in read_sources({"c": big})[1].message
    # A "regular" file whose read would block (procfs's kmsg): a FIFO with a writer, no data,
    # reported regular. Nothing to read without waiting, so nothing is read.
    writer = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
    real_fstat = os.fstat
    monkeypatch.setattr(os, "fstat", lambda fd: os.stat_result(
        (stat.S_IFREG | 0o644,) + tuple(real_fstat(fd))[1:]))
    try:
        files, problem = read_sources({"c": fifo})
    finally:
        monkeypatch.undo()
        os.close(writer)
    assert files == {} and "has nothing to read without waiting" in problem.message


def test_a_folder_with_its_own_checks_is_refused_and_none_of_it_runs(tmp_path, capsys):
    """Red team 8's `alice_lab01`: a student folder holding its own checks.py (the student
    edition's, plus code) graded without --lab was loaded as the lab, in the grader, as root:
    it wrote a file and patched the scores (40/40 for stubs). Now refused, exit status 2, and
    nothing of the folder runs: the file its checks.py and harness.py would write never
    appears, whether the folder or the file in it is named."""
    alice = tmp_path / "alice_lab01"
    alice.mkdir()
    marker = tmp_path / "PWNED.txt"
    run = f"from pathlib import Path\nPath({str(marker)!r}).write_text('ran in the grader')\n"
    for name in ("checks.py", "harness.py"):
        (alice / name).write_text(run + (LAB / name).read_text())
    (alice / "collectives.py").write_text((LAB / "collectives.py").read_text())
    for path in (alice, alice / "collectives.py"):
        assert cli(["grade", str(path), "--no-color"]) == 2
        err = capsys.readouterr().err
        assert f"{alice} is not one of this grader's labs" in err
        assert "never runs a submission's own checks.py" in err and "--lab" in err
        assert not marker.exists()
