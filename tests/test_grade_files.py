"""What `grade` grades and how it says so: the file only where the lab says it is (several
refused, none named with where it looked), the file graded named in the report, a wrong file, a
binary file or a syntax error said once in one line naming the right file; a copy of a lab
graded with the installation's full checks; `batch` on a missing folder or into an earlier
--out. (Which mistakes the checks name: test_autograder_faults.py.)"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from autograder.cli import main as cli
from autograder.release import release_lab
from autograder.submission import locate, parse_problem

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
