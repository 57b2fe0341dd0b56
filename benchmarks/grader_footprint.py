"""What the grader keeps per launch for correct solutions, and its peak memory under attack.

The grader's courier caps what it holds per launch (`autograder.sandbox.courier`: results the
ranks return, calls and marks it records, bytes waiting for a receive or a reader, message
contents kept for the judges). The caps must sit well above what any correct solution needs:
this script grades each lab's reference solution (every visible and hidden check) and prints,
for the launch that needed most, each of those figures, and the grading process's peak RSS
(``ru_maxrss``, one fresh process per grade). With ``--attack PATH`` it grades a lab-01
submission (the red team's) the same way and prints the peak RSS; with ``--fault LAB/NAME`` a
fault of the corpus (``tests/faults/LAB/NAME.py`` appended to the lab's reference, as the fault
tests build it) on the lab's visible checks, beside the reference's own visible grade.

Usage: python benchmarks/grader_footprint.py [--labs 01,02,...] [--attack DIR_OR_FILE ...]
       [--fault 06_mixed_precision/broadcast_shapes ...]
Memory, not time: a loaded machine changes nothing here but the seconds.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LABS = ROOT / "labs"

# Run in a fresh interpreter per grade so that ru_maxrss is this grade's alone. The wrappers
# only read the courier's counters (a measurement; the package itself is unchanged).
_CHILD = r"""
import json, resource, sys
from pathlib import Path
from autograder.grade import grade
from autograder.lab import find_lab, load_lab
from autograder.sandbox import courier as cm, launch

peaks = {"returned": 0, "calls": 0, "marks": 0, "kept": 0, "held": 0, "outbox": 0}
launches, marks = [0], {}
init, reply, handle = cm.Courier.__init__, cm.Courier.reply, launch.handle

def _init(self, *a, **k):
    init(self, *a, **k)
    launches[0] += 1
    self.bench_number = launches[0]

def _reply(self, rank, meta, payload=b""):
    reply(self, rank, meta, payload)
    peaks["held"] = max(peaks["held"], self.held)
    peaks["outbox"] = max(peaks["outbox"], sum(len(s.outbox) for s in self.ranks))

def _handle(c, rank, meta, payload):
    handle(c, rank, meta, payload)
    if isinstance(meta, dict) and meta.get("k") == "mark":
        marks[c.bench_number] = marks.get(c.bench_number, 0) + 1
        peaks["marks"] = max(peaks["marks"], marks[c.bench_number])
    for name, value in (("returned", c.returned), ("calls", c.calls), ("kept", c.kept)):
        peaks[name] = max(peaks[name], value)

cm.Courier.__init__, cm.Courier.reply, launch.handle = _init, _reply, _handle
lab = load_lab(find_lab(sys.argv[1]), hidden=sys.argv[3] == "hidden")
result = grade(lab, Path(sys.argv[2]))
print(json.dumps({"score": result.score, "max": result.max_score, "launches": launches[0],
                  "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "kinds": sorted({c.kind for c in result.checks if c.kind}), **peaks}))
"""


def measure(lab: str, path: Path, hidden: bool = True) -> dict:
    out = subprocess.run([sys.executable, "-c", _CHILD, lab, str(path),
                          "hidden" if hidden else "visible"],
                         capture_output=True, text=True, cwd=ROOT, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _mib(n: int) -> str:
    return f"{n / 2**20:,.2f} MiB"


def _student(lab_dir: Path) -> Path:
    """The lab's (first) student file: the reference solution."""
    sys.path.insert(0, str(ROOT))
    from autograder.lab import load_lab

    return lab_dir / load_lab(lab_dir, hidden=False).info.student_files[0]


def fault(spec: str, folder: Path) -> None:
    """Grade fault `spec` (LAB/NAME) and the reference on the lab's visible checks; print each
    grade's score, kinds, seconds and the grader's peak RSS."""
    lab, name = spec.split("/")
    reference = _student(LABS / lab)
    path = folder / name / reference.name
    path.parent.mkdir(parents=True)
    path.write_text(reference.read_text() + f"\n\n# ---- fault: {name} ----\n\n"
                    + (ROOT / "tests" / "faults" / lab / f"{name}.py").read_text())
    for what, sub in (("reference", reference), (name, path)):
        start = time.monotonic()
        m = measure(lab, sub, hidden=False)
        print(f"{lab} {what}: {m['score']:g}/{m['max']:g} (kinds {m['kinds']}), "
              f"{time.monotonic() - start:.1f} s; grader peak RSS {m['rss_mib']:,.0f} MiB")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--labs", default="01,02,03,04,05,06,07",
                    help="comma-separated lab numbers, or ''")
    ap.add_argument("--attack", nargs="*", default=[],
                    help="lab-01 submissions to grade (visible checks), peak RSS printed")
    ap.add_argument("--fault", nargs="*", default=[],
                    help="faults of the corpus, LAB/NAME (tests/faults/LAB/NAME.py), graded on "
                         "the lab's visible checks beside its reference; peak RSS printed")
    args = ap.parse_args()
    for number in [n for n in args.labs.split(",") if n]:
        lab_dir = next(p for p in sorted(LABS.iterdir()) if p.name.startswith(number))
        student = _student(lab_dir)
        m = measure(lab_dir.name, student)
        print(f"{lab_dir.name}: {m['score']:g}/{m['max']:g}, {m['launches']} launches; most in "
              f"one launch: returned {_mib(m['returned'])}, {m['calls']:,} calls and marks "
              f"({m['marks']:,} marks), kept {_mib(m['kept'])}, held {_mib(m['held'])}, "
              f"replies queued {_mib(m['outbox'])}; grader peak RSS {m['rss_mib']:,.0f} MiB")
    for path in args.attack:
        m = measure("01_collectives", Path(path), hidden=False)
        print(f"{path}: {m['score']:g}/{m['max']:g} (kinds {m['kinds']}), returned "
              f"{_mib(m['returned'])}, {m['calls']:,} calls and marks ({m['marks']:,} marks) "
              f"in the launch that made most; grader peak RSS {m['rss_mib']:,.0f} MiB")
    if args.fault:
        with tempfile.TemporaryDirectory() as tmp:
            for spec in args.fault:
                fault(spec, Path(tmp))


if __name__ == "__main__":
    main()
