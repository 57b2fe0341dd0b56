"""What the grader keeps per launch for correct solutions, and its peak memory under attack.

The grader's courier caps what it holds per launch (`autograder.sandbox.courier`: results the
ranks return, calls and marks it records, bytes waiting for a receive or a reader, message
contents kept for the judges). The caps must sit well above what any correct solution needs:
this script grades each lab's reference solution (every visible and hidden check) and prints,
for the launch that needed most, each of those figures (stacks: the most stacks of waits one
rank kept at once), and the grading process's peak RSS (VmHWM, `watchdog.peak_rss_mib`: one
fresh process per grade). With ``--attack PATH`` it grades a lab-01 submission (the red team's)
the same way and prints the peak RSS; with ``--fault LAB/NAME`` a fault of the corpus
(``tests/faults/LAB/NAME.py`` appended to the lab's reference, as the fault tests build it) on
the lab's visible checks, beside the reference's own visible grade (graded once per lab).

Usage: python benchmarks/grader_footprint.py [--labs 01,02,...] [--attack DIR_OR_FILE ...]
       [--fault 06_mixed_precision/broadcast_shapes ...] [--save | --record FILE.json]
Memory, not time: a loaded machine changes nothing here but the seconds. ``--save`` records
each grade's figures in benchmarks/results/grader_footprint.json (`saved`), where
docs/grading.md's tables of the courier's caps and of the attacks read them.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import saved  # noqa: E402  (benchmarks/saved.py)

ROOT = Path(__file__).resolve().parents[1]
LABS = ROOT / "labs"
ABOUT = ("Per grade (a lab's reference with its hidden checks, keyed by the lab; a fault of the "
         "corpus on its lab's visible checks, 'fault LAB/NAME', with that lab's reference "
         "graded the same way; an attack on lab 01's visible checks): score, launches, the most "
         "one launch needed of each thing the courier caps (returned, kept, held, outbox: "
         "bytes; calls and marks: counts; stacks: per rank), the failure kinds, the grading "
         "process's peak RSS in MiB and its seconds. benchmarks/grader_footprint.py --save.")

# Run in a fresh interpreter per grade so that its VmHWM is this grade's alone. The wrappers
# only read the courier's counters (a measurement; the package itself is unchanged).
_CHILD = r"""
import json, sys
from pathlib import Path
from autograder.grade import grade
from autograder.sandbox.watchdog import peak_rss_mib
from autograder.lab import find_lab, load_lab
from autograder.sandbox import courier as cm, launch

peaks = {"returned": 0, "calls": 0, "marks": 0, "kept": 0, "held": 0, "outbox": 0, "stacks": 0}
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
    for name, value in (("returned", c.returned), ("calls", c.calls), ("kept", c.kept),
                        ("stacks", max(s.stacks for s in c.ranks))):
        peaks[name] = max(peaks[name], value)

cm.Courier.__init__, cm.Courier.reply, launch.handle = _init, _reply, _handle
lab = load_lab(find_lab(sys.argv[1]), hidden=sys.argv[3] == "hidden")
result = grade(lab, Path(sys.argv[2]))
print(json.dumps({"score": result.score, "max": result.max_score, "launches": launches[0],
                  "rss_mib": peak_rss_mib(),
                  "kinds": sorted({c.kind for c in result.checks if c.kind}), **peaks}))
"""


def measure(lab: str, path: Path, hidden: bool = True) -> dict:
    """The grade's figures (the child's line) and its ``seconds``, interpreter start included."""
    start = time.monotonic()
    out = subprocess.run([sys.executable, "-c", _CHILD, lab, str(path),
                          "hidden" if hidden else "visible"],
                         capture_output=True, text=True, cwd=ROOT, check=True)
    return {**json.loads(out.stdout.strip().splitlines()[-1]),
            "seconds": round(time.monotonic() - start, 2)}


def _mib(n: int) -> str:
    return f"{n / 2**20:,.2f} MiB"


def _student(lab_dir: Path) -> Path:
    """The lab's (first) student file: the reference solution."""
    sys.path.insert(0, str(ROOT))
    from autograder.lab import load_lab

    return lab_dir / load_lab(lab_dir, hidden=False).info.student_files[0]


def fault(spec: str, folder: Path, references: dict[str, dict]) -> dict:
    """Grade fault `spec` (LAB/NAME) on the lab's visible checks, and the lab's reference the
    same way unless `references` holds it; print each grade's score, kinds, seconds and the
    grader's peak RSS. Returns the fault's figures with its reference's beside them."""
    lab, _, name = spec.partition("/")
    source = ROOT / "tests" / "faults" / lab / f"{name}.py"
    if not source.is_file():
        raise SystemExit(f"--fault {spec}: no {source.relative_to(ROOT)} (LAB/NAME, e.g. "
                         "01_collectives/output_hoard)")
    reference = _student(LABS / lab)
    path = folder / lab / name / reference.name
    path.parent.mkdir(parents=True)
    path.write_text(reference.read_text() + f"\n\n# ---- fault: {name} ----\n\n"
                    + source.read_text())
    if lab not in references:
        references[lab] = measure(lab, reference, hidden=False)
    m = measure(lab, path, hidden=False)
    for what, r in (("reference", references[lab]), (name, m)):
        print(f"{lab} {what}: {r['score']:g}/{r['max']:g} (kinds {r['kinds']}), "
              f"{r['seconds']:.1f} s; grader peak RSS {r['rss_mib']:,.0f} MiB", flush=True)
    return {**m, "reference": {k: references[lab][k]
                               for k in ("score", "max", "kinds", "rss_mib", "seconds")}}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--labs", default="01,02,03,04,05,06,07",
                    help="comma-separated lab numbers, or ''")
    ap.add_argument("--attack", nargs="*", default=[],
                    help="lab-01 submissions to grade (visible checks), peak RSS printed")
    ap.add_argument("--fault", nargs="*", default=[],
                    help="faults of the corpus, LAB/NAME (tests/faults/LAB/NAME.py), graded on "
                         "the lab's visible checks beside its reference; peak RSS printed")
    saved.add_arguments(ap, "grader_footprint")
    args = ap.parse_args(argv)
    save_to = saved.target(ap, args, "grader_footprint")

    def keep(key: str, m: dict, load_before: float) -> None:
        saved.record(save_to, "grader_footprint", key, m, about=ABOUT, load_before=load_before,
                     argv=argv)

    for number in [n for n in args.labs.split(",") if n]:
        lab_dir = next((p for p in sorted(LABS.iterdir()) if p.name.startswith(number)), None)
        if lab_dir is None:
            ap.error(f"--labs: no lab starts with {number!r} in {LABS}")
        load_before = saved.load_average()
        m = measure(lab_dir.name, _student(lab_dir))
        print(f"{lab_dir.name}: {m['score']:g}/{m['max']:g}, {m['launches']} launches; most in "
              f"one launch: returned {_mib(m['returned'])}, {m['calls']:,} calls and marks "
              f"({m['marks']:,} marks), kept {_mib(m['kept'])}, held {_mib(m['held'])}, "
              f"replies queued {_mib(m['outbox'])}, {m['stacks']} stack(s) of waits per rank; "
              f"grader peak RSS {m['rss_mib']:,.0f} MiB", flush=True)
        keep(lab_dir.name, m, load_before)
    for path in args.attack:
        load_before = saved.load_average()
        m = measure("01_collectives", Path(path), hidden=False)
        print(f"{path}: {m['score']:g}/{m['max']:g} (kinds {m['kinds']}), returned "
              f"{_mib(m['returned'])}, {m['calls']:,} calls and marks ({m['marks']:,} marks) "
              f"in the launch that made most; grader peak RSS {m['rss_mib']:,.0f} MiB")
        keep(f"attack {Path(path).name}", m, load_before)
    if args.fault:
        references: dict[str, dict] = {}
        with tempfile.TemporaryDirectory() as tmp:
            for spec in args.fault:
                load_before = saved.load_average()
                keep(f"fault {spec}", fault(spec, Path(tmp), references), load_before)


if __name__ == "__main__":
    main()
