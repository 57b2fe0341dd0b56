"""The `autograder` command: grade, batch, gradescope, release, labs.

    autograder grade .                                    # a student, in their lab's folder
    autograder grade my_collectives.py --lab 01_collectives
    autograder batch submissions/ --lab 01_collectives --jobs 2 --out graded/
    autograder batch submissions/ --lab 01_collectives --slurm --out graded/   # a job array
    autograder batch submissions/ --lab 02_ddp --device cuda --gpus-per-grade 4 --jobs 2
    autograder gradescope --lab 01_collectives --out autograder.zip
    autograder release --course --out ../course-student   # the student repository to publish
    autograder release --lab 01_collectives --out student/01_collectives

Exit statuses: `EXIT_STATUS`, which every command's --help prints.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
import traceback
from pathlib import Path

from .lab import find_lab, load_lab

LABS_ROOT = Path(__file__).resolve().parent.parent / "labs"
EXIT_STATUS = """exit status:
  0    done; for grade: a report was produced, whatever the score (a missing file or a
       syntax error is a grade of 0, said once in the report)
  1    the grader itself failed (a traceback; with --json, results.json says so)
  2    bad arguments: a path that does not exist, an unknown lab, an --out that exists
  130  interrupted (Ctrl-C)
  143  stopped by SIGTERM (129: SIGHUP); the grade's ranks and folder were cleaned up first"""


def _resolve(path: Path, lab: str | None) -> tuple[Path, Path]:
    """(lab folder, submission) from `grade`'s arguments. A slug is looked up in the labs root
    only (never in the current folder); a lab given as a path is taken as given. A copy of a
    lab (a lab folder elsewhere, e.g. in `make lab`'s workspace, or a file in one) is graded
    by this installation's own lab of that name: its checks, hidden ones included, never the
    copy's. A folder whose name no installed lab has is refused: its checks.py would run in the
    grader, as the grader's user (root on a grading host), so only `--lab PATH` (a lab folder
    the instructor names and trusts) may bring checks of its own."""
    if lab:
        return find_lab(lab, LABS_ROOT), path
    folder = path if path.is_dir() else path.parent
    if (folder / "checks.py").is_file():
        own = LABS_ROOT / folder.resolve().name
        if (own / "checks.py").is_file():
            return own, path
        raise ValueError(f"{folder} is not one of this grader's labs (none is named "
                         f"{folder.resolve().name!r}; `autograder labs` lists them), and the "
                         "grader never runs a submission's own checks.py. Pass --lab with the "
                         "lab it is for, or --lab PATH for a lab folder you trust")
    if path.is_file():
        owners = []
        for checks in sorted(LABS_ROOT.glob("*/checks.py")):
            if (checks.parent / path.name).is_file():
                owners.append(checks.parent)
        if len(owners) == 1:
            return owners[0], path
    raise ValueError(f"which lab is {path} for? Pass --lab (e.g. --lab 01_collectives) or grade a "
                     "lab folder (one with checks.py)")


def _grade(args) -> int:
    from . import device_args
    from .devices import resolve_device
    from .grade import grade
    from .report import to_text, write_results
    from .sandbox.limits import Limits

    if not args.path.exists():
        raise ValueError(f"{args.path} does not exist")
    lab_dir, submission = _resolve(args.path, args.lab)
    if args.device == "cuda" and not args.gpus:  # an instructor's option: refused, not graded
        resolve_device("cuda", gpus=0, ranks=1)
    try:
        lab = load_lab(lab_dir, hidden=not args.no_hidden)
        device, gpus = device_args.for_grade(args, lab)
        limits = Limits(wall_s=args.timeout) if args.timeout else Limits()
        progress = (lambda line: print(line, file=sys.stderr, flush=True)) if args.progress \
            else None
        result = grade(lab, submission, limits=limits, device=device, gpus=gpus,
                       progress=progress, unconfined=args.unconfined)
    except Stopped as stop:
        if args.json:  # never leave Gradescope without a results.json
            _internal_error(args.json, f"The grade was stopped ({stop.name}) before it "
                                       "finished; nothing was judged.")
        raise
    except Exception:
        if args.json:  # never leave Gradescope without a results.json
            _internal_error(args.json, traceback.format_exc())
        raise
    if args.json:
        write_results(result, args.json)
    print(to_text(result, color=not args.no_color and sys.stdout.isatty()))
    if args.json:
        print(f"\nresults.json written to {args.json}")
    return 0


def _internal_error(path: Path, detail: str) -> None:
    import json

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"score": 0.0, "execution_time": 0, "tests": [],
                                "output": "The grader failed on this submission; please tell "
                                          "your instructor.\n" + detail[-2000:]}, indent=2))


def _batch(args) -> int:
    from . import device_args
    from .batch import run_batch

    lab_dir = find_lab(args.lab, LABS_ROOT)
    lab = load_lab(lab_dir)  # fail early on a broken lab, before starting anything
    if args.sbatch and args.slurm is None:
        raise ValueError("--sbatch passes options to SLURM's sbatch: add --slurm")
    if args.slurm is not None:
        from .slurm import run_slurm_batch

        tasks = None if args.slurm == "auto" else args.slurm
        rows = run_slurm_batch(args.folder, lab_dir, args.out, tasks=tasks,
                               jobs=args.jobs, max_score=lab.max_score,
                               sbatch_args=args.sbatch, **device_args.for_slurm(args, lab))
    else:
        device, sets = device_args.for_batch(args, lab)
        rows = run_batch(args.folder, lab_dir, args.out, jobs=args.jobs, device=device,
                         gpu_sets=sets)
    scores = [float(r["score"]) for r in rows]
    print(f"graded {len(rows)} submissions into {args.out} (summary.csv); "
          f"mean score {sum(scores) / len(scores):.1f}")
    return 0


def _gradescope(args) -> int:
    from .gradescope import build_bundle

    out = build_bundle(find_lab(args.lab, LABS_ROOT), args.out)
    print(f"wrote {out}: upload it as the autograder of a Gradescope programming assignment")
    return 0


def _release(args) -> int:
    from .edition import release_course, release_workspace
    from .release import release_lab

    if args.course:
        done = release_course(args.out, force=args.force)
        print(f"wrote the student edition of the course to {args.out}: {done.files} files, "
              f"{done.regions} solution regions replaced by stubs; hidden checks, tests and "
              "instructors' sections left out (autograder/edition.py lists what and why)")
        for note in done.notes:
            print(f"note: {note}")
        return 0
    if args.workspace:
        added, kept = release_workspace(args.out)
        print(f"workspace {args.out}: " + (f"kept your {kept} files, " if kept else "")
              + f"added {added} new from the student edition")
        return 0
    lab_dir = find_lab(args.lab, LABS_ROOT)
    stubbed = release_lab(lab_dir, args.out, force=args.force)
    regions = ", ".join(f"{f} ({n})" for f, n in stubbed.items()) or "none"
    print(f"wrote the student edition of {lab_dir.name} to {args.out}; solution regions "
          f"replaced by stubs: {regions}; hidden/ left out")
    return 0


def _labs(args) -> int:
    root = Path(args.root) if args.root else LABS_ROOT
    for checks in sorted(root.glob("*/checks.py")):
        lab = load_lab(checks.parent)
        hidden = sum(not c.visible for c in lab.checks)
        print(f"{checks.parent.name}: {lab.info.title} — {len(lab.checks)} checks "
              f"({hidden} hidden), {lab.max_score:g} points; student files: "
              f"{', '.join(lab.info.student_files)}")
    return 0


def _tasks(text: str) -> int | str:
    """--slurm's TASKS: a count, or "auto" (the flag alone: one task per submission)."""
    return text if text == "auto" else int(text)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="autograder", description="Grade multi-rank lab submissions safely: results and "
        "communication checked on real ranks, Gradescope results.json written.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    g = sub.add_parser("grade", help="grade one submission (a lab folder, a folder or a file)",
                       description="Run a lab's checks on a submission in the sandbox and print "
                       "a report (and, with --json, write Gradescope's results.json).")
    g.add_argument("path", type=Path, help="a lab folder (your work in it is graded), a "
                   "submission folder, or the student file itself")
    g.add_argument("--lab", help="lab slug, looked up in this project's labs/ only (e.g. "
                   "01_collectives), or a lab folder given as a path (./x, a/b, /abs)")
    g.add_argument("--json", type=Path, help="write results.json here")
    g.add_argument("--no-hidden", action="store_true", help="run the visible checks only")
    g.add_argument("--timeout", type=float, help="total budget of the whole grade, wall-clock "
                   "seconds (default 180)")
    g.add_argument("--no-color", action="store_true", help="plain text report")
    g.add_argument("--progress", action="store_true", help="a line on stderr as each launch "
                   "ends (check, ranks, outcome, seconds)")
    g.add_argument("--device", choices=("cpu", "cuda", "auto"), default="cpu",
                   help="where the ranks run: cpu (default), cuda (the GPUs of "
                   "CUDA_VISIBLE_DEVICES: one per rank of the largest launch, or shared by the "
                   "ranks when fewer), auto (cuda when there is a GPU per rank)")
    g.add_argument("--unconfined", action="store_true",
                   help="run the ranks WITHOUT the sandbox (no private worlds, uids or "
                   "namespaces): only for grading your own work on a machine that forbids user "
                   "namespaces (the grade then refuses to run and says so). The report and "
                   "results.json say the grade is not sandboxed; batch and Gradescope never use "
                   "it")
    g.set_defaults(run=_grade)

    b = sub.add_parser("batch", help="grade every submission in a folder (CSV summary)",
                       description="Grade each sub-folder or .py file of FOLDER in its own "
                       "grader process, JOBS at a time, with a progress bar.")
    b.add_argument("folder", type=Path, help="folder of submissions")
    b.add_argument("--lab", required=True, help="lab slug or folder")
    b.add_argument("--jobs", type=int, default=2, help="grades at once (default 2; each uses "
                   "up to 4 ranks)")
    b.add_argument("--device", choices=("cpu", "cuda", "auto"), default="cpu",
                   help="where each grade's ranks run (as for grade)")
    b.add_argument("--gpus-per-grade", type=int, metavar="G",
                   help="GPUs per grade with --device cuda (default: the lab's largest launch, "
                   "or all there are when fewer; fewer than the ranks are shared, 1 allowed); "
                   "grades at once get disjoint sets, never more grades than sets")
    b.add_argument("--out", type=Path, default=Path("graded"), help="output folder "
                   "(default ./graded)")
    b.add_argument("--slurm", type=_tasks, nargs="?", const="auto", metavar="TASKS",
                   help="grade through SLURM: one job array, submissions split across TASKS array "
                   "tasks (default one per submission), each running this same batch command; "
                   "waits, then gathers summary.csv (autograder/slurm.py)")
    b.add_argument("--sbatch", default="", metavar="OPTIONS",
                   help='extra sbatch options with --slurm, written with = as they start with --: '
                   '--sbatch="--partition=cpu --time=1:00:00"')
    b.set_defaults(run=_batch)

    s = sub.add_parser("gradescope", help="build a Gradescope autograder zip for a lab",
                       description="Write a zip with setup.sh, run_autograder and the sources.")
    s.add_argument("--lab", required=True, help="lab slug or folder")
    s.add_argument("--out", type=Path, default=Path("autograder.zip"), help="zip to write")
    s.set_defaults(run=_gradescope)

    r = sub.add_parser("release", help="write the student edition of a lab or of the course",
                       description="Write a student edition: every solution region replaced "
                       "by its stub and hints, no hidden checks, no instructors' sections. "
                       "--course writes the whole student repository to publish; --workspace "
                       "the lessons and labs that `make lab` opens (adding what is missing, "
                       "never overwriting).")
    which = r.add_mutually_exclusive_group(required=True)
    which.add_argument("--lab", help="one lab: slug or folder")
    which.add_argument("--course", action="store_true", help="the whole course: the student "
                       "repository an instructor publishes (Binder, nbgitpuller, the website)")
    which.add_argument("--workspace", action="store_true", help="lessons and labs into --out, "
                       "adding only files it does not have yet (what `make lab` runs)")
    r.add_argument("--out", type=Path, required=True, help="folder to write (must not exist, "
                   "except with --workspace)")
    r.add_argument("--force", action="store_true", help="replace --out if it exists")
    r.set_defaults(run=_release)

    lb = sub.add_parser("labs", help="list the labs and their checks")
    lb.add_argument("--root", help="folder holding the labs (default: this project's labs/)")
    lb.set_defaults(run=_labs)
    for command in (p, *sub.choices.values()):  # every --help ends with the exit statuses
        command.epilog = EXIT_STATUS
        command.formatter_class = argparse.RawDescriptionHelpFormatter
    return p


def main(argv: list[str] | None = None) -> int:
    from toolkit.launch.gpus import hidden_cuda_env

    from . import device_args

    args = parser().parse_args(argv)
    # The GPUs this process may hand out, counted before hiding them: judges that run toolkit
    # code on ranks in this process (lab 04's pipeline) must pick gloo; a cuda grade's ranks
    # get their set explicitly (autograder.devices).
    args.gpus = device_args.visible() if getattr(args, "device", "cpu") != "cpu" else []
    os.environ.update(hidden_cuda_env())  # and none of them starts the CUDA driver here
    with _stopped_cleanly():
        try:
            return args.run(args)
        except (ValueError, FileExistsError) as err:
            print(f"autograder {args.command}: {err}", file=sys.stderr)
            return 2


class Stopped(SystemExit):
    """The command was asked to stop by a signal; exits with 128 + its number, as a shell
    reports a process killed by it."""

    def __init__(self, signum: int) -> None:
        super().__init__(128 + signum)
        self.name = signal.Signals(signum).name


@contextlib.contextmanager
def _stopped_cleanly():
    """SIGTERM or SIGHUP (a batch's timeout, SLURM's scancel, a closed terminal) unwind the
    command like Ctrl-C does, so every `finally` runs: the grade's ranks and fork server are
    stopped and its /tmp/grade-* folder removed. Python's default for SIGTERM is to die on the
    spot, which left both behind. A second signal during that cleanup is ignored (SIGKILL still
    works). Installed only while the command runs, and only from the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, _frame):
        for s in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(s, signal.SIG_IGN)
        raise Stopped(signum)

    old = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


__all__ = ["main", "parser"]
