"""Grade one submission of one lab: plan its cases, run them in the sandbox, judge them here.

    lab = load_lab(find_lab("01_collectives"))
    result = grade(lab, Path("submission/"))
    result.score, result.max_score; write_results(result, Path("results.json"))

Order of events: find the student files (missing → every check zero); parse them here
(`compile` runs nothing: a syntax error is reported with its line without starting anything);
draw the grade's secret and make every case's inputs from it (`plan`: a case's seed is derived
from the secret, so no rank can rebuild another's inputs, and so is each case's gate key,
`sandbox.gate`); run every launch in the sandbox
(`autograder.sandbox.session`), where the courier hands each rank its own inputs and records
what it sends; judge each launch's cases in this process as soon as the launch ends
(`autograder.judging.judge_launch`: the grader then drops the launch's outputs and record, so
what it holds is one launch's worth, within the courier's caps); then score every check. A
results.json left in a rank's folder zeroes the grade (``--unconfined`` only: in the sandbox a
rank's folder is in its own world, gone when it ends). A host that cannot build the sandbox gets
no grade: every check is ``sandbox_unavailable`` with the reason.
"""

from __future__ import annotations

import ast
import hashlib
import os
import secrets
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .devices import shared_note
from .judging import NOT_JUDGED, CheckResult, PlannedCase, judge_launch, judge_run
from .lab import Lab
from .protocol import CaseKey, GroupKey
from .sandbox.files import remove
from .sandbox.gate import case_key
from .sandbox.limits import Limits
from .sandbox.plan import CasePlan, Job, LaunchPlan
from .sandbox.scratch import unmount_below
from .sandbox.session import run_session
from .submission import Problem, locate, parse_problem, read_sources
from .sandbox.summary import UNCONFINED

HARNESS = "_lab_harness.py"


@dataclass
class GradeResult:
    lab: Lab
    submission: str
    checks: list[CheckResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    sandbox: str = ""
    files: dict[str, str] = field(default_factory=dict)
    """{lab file name: the path graded for it} (the report names what it graded)."""
    problem: Problem | None = None
    """What stopped every check before any ran (a missing file, a syntax error): said once."""

    @property
    def score(self) -> float:
        return round(sum(c.score for c in self.checks), 2)

    @property
    def max_score(self) -> float:
        return self.lab.max_score


def _defined_names(source: bytes) -> set[str]:
    names = set()
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def max_ranks(lab: Lab) -> int:
    """The most ranks any launch of `lab` starts (a cuda grade needs one GPU each)."""
    return max((int(c["world_size"]) for check in lab.checks for c in check.cases), default=1)


def case_seed(secret: int, key: CaseKey, seed: int) -> int:
    """The seed case `key` runs with in a grade whose secret is `secret` (40 bits; the lab's
    own seed is mixed in so that two cases of a check never share inputs)."""
    digest = hashlib.blake2b(f"{secret}:{key.check}:{key.index}:{seed}".encode(), digest_size=5)
    return int.from_bytes(digest.digest(), "little")


def plan(lab: Lab, secret: int) -> tuple[list[LaunchPlan], dict[CaseKey, PlannedCase]]:
    """One launch per (check, world size), each case with its inputs made from `secret`; and
    every case as the judges will see it."""
    launches, cases = [], {}
    for ci, check in enumerate(lab.checks):
        by_size: dict[int, list[CasePlan]] = {}
        for k, case in enumerate(check.cases):
            key = CaseKey(ci, k)
            gate = case_key(secret, ci, k)  # the courier's answers to this case's gates
            full = dict(case, seed=case_seed(secret, key, int(case.get("seed", 0))),
                        gate_key=gate)
            ws = case["world_size"]
            inputs = list(lab.harness.make_inputs(full, ws))
            cases[key] = PlannedCase(full, inputs)
            public = {name: v for name, v in case.items() if name not in ("seed", "gate_key")}
            by_size.setdefault(ws, []).append(CasePlan(k, check.call, public, inputs, gate))
        for ws, planned in sorted(by_size.items()):
            launches.append(LaunchPlan(GroupKey(ci, ws), check.timeout, planned))
    return launches, cases


def prepare_workdir(files: dict[str, bytes], base: Path | None = None) -> tuple[Path, Path]:
    """A fresh private folder for one grade, with the code the ranks read in ``code/``."""
    workdir = Path(tempfile.mkdtemp(prefix="grade-", dir=base))
    try:  # a full disk or a SIGTERM (cli's Stopped) while copying leaves no folder behind
        os.chmod(workdir, 0o711)
        code = workdir / "code"
        code.mkdir(mode=0o755)
        for name, content in files.items():
            (code / name).write_bytes(content)
            os.chmod(code / name, 0o644)
    except BaseException:
        remove(workdir)
        raise
    return workdir, code


def grade(lab: Lab, submission: Path, *, limits: Limits | None = None, landlock: bool = True,
          workbase: Path | None = None, secret: int | None = None, device: str = "cpu",
          gpus: list[int] | None = None,
          progress: Callable[[str], None] | None = None,
          unconfined: bool = False) -> GradeResult:
    """Grade `submission` (a folder or a single file) against every check of `lab`. `secret`
    fixes the grade's inputs (tests); by default it is drawn fresh for every grade. `device`
    "cuda" runs rank r on GPU r mod G of `gpus` (G of them: one per rank of the largest
    launch, or fewer, shared; `autograder.devices`); values are judged on CPU copies either
    way. `progress` hears one line per launch as it ends (check, ranks, outcome, seconds since
    the grade began). `unconfined` runs the ranks without the sandbox's worlds (``grade
    --unconfined``: a student's own laptop that forbids user namespaces); the notes and
    results.json then say so first."""
    if device not in ("cpu", "cuda"):
        raise ValueError(f"grade: device must be 'cpu' or 'cuda' (resolve 'auto' with "
                         f"autograder.devices.resolve_device), got {device!r}")
    if device not in lab.info.devices:
        raise ValueError(f"{lab.info.slug} runs on {', '.join(lab.info.devices)} only, not "
                         f"{device}: grade it with --device cpu")
    if device == "cuda" and not gpus:
        raise ValueError(f"grade: a cuda grade of {lab.info.slug} needs its GPUs (1 to "
                         f"{max_ranks(lab)}; fewer than its ranks are shared), got {gpus!r}")
    if not _ONE_AT_A_TIME.acquire(blocking=False):
        if progress is not None:
            progress("waiting for another grade in this process to end (one at a time: "
                     "grade in parallel with processes, as `autograder batch --jobs` does)")
        _ONE_AT_A_TIME.acquire()
    try:  # the budget starts once this grade has the grader to itself
        return _grade(lab, submission, limits=limits, landlock=landlock, workbase=workbase,
                      secret=secret, device=device, gpus=gpus, progress=progress,
                      unconfined=unconfined)
    finally:
        _ONE_AT_A_TIME.release()


_ONE_AT_A_TIME = threading.Lock()
"""One grade at a time in a process. A grade's session treats every child of the grader that it
did not start and that was there before it as an orphan of its launch (the grader is the
subreaper its ranks' escaped descendants are given to) and kills it: another thread's fork
server and ranks would be killed with them, and that grade's checks "not run". Threads wait
their turn, each with its whole budget; `autograder batch --jobs N` grades in N processes."""


def _grade(lab: Lab, submission: Path, *, limits: Limits | None, landlock: bool,
           workbase: Path | None, secret: int | None, device: str, gpus: list[int] | None,
           progress: Callable[[str], None] | None, unconfined: bool) -> GradeResult:
    """`grade`'s body, run with the grader to itself."""
    start = time.monotonic()
    limits = limits or Limits()
    deadline = start + limits.wall_s  # everything below, judging included, ends by it
    submission = Path(submission)
    result = GradeResult(lab, str(submission))
    paths, problem = locate(lab.info.student_files, (lab.info.slug, lab.path.name), submission)
    result.files = {name: str(path) for name, path in paths.items()}
    files, unreadable = read_sources(paths) if problem is None else ({}, None)
    problem = problem or unreadable

    def zero_all(problem: Problem) -> GradeResult:
        # Said once (GradeResult.problem); each check only says that it did not run, and why.
        result.problem = problem
        result.checks = [CheckResult(c, 0.0, 0, len(c.cases), problem.kind,
                                     "Not run: see the problem above the checks.")
                         for c in lab.checks]
        result.seconds = time.monotonic() - start
        return result

    shared = shared_note(ranks=max_ranks(lab), gpus=len(gpus or [])) if device == "cuda" \
        else None
    if shared:
        result.notes.append(shared)
    if lab.hidden_listed:
        listed = "; ".join(f"{name} ({points:g})" for name, points in lab.hidden_listed)
        result.notes.append(f"This lab folder has the visible checks only: the score counts "
                            f"them. Hidden checks, which your instructor's grader runs on what "
                            f"you hand in: {listed}.")
    elif not lab.hidden_loaded:
        result.notes.append("Hidden checks were not run (this lab folder has none, e.g. a "
                            "student edition): the score counts the visible checks only.")
    problem = problem or parse_problem(files)
    if problem:
        return zero_all(problem)
    defined = _defined_names(files[lab.info.student_files[0]])
    absent = [n for n in lab.info.names if n not in defined]
    if absent:
        result.notes.append(f"Not defined at the top level of {lab.info.student_files[0]}: "
                            f"{', '.join(absent)} (the checks that call them will fail).")
    launches, cases = plan(lab, secrets.randbits(64) if secret is None else secret)
    budget = f" of {limits.wall_s:g} s"

    def on_record(record) -> None:
        judge_launch(lab, record, cases, deadline=deadline, budget=budget)
        if progress is not None:
            how = "ok" if record.failure is None else record.failure.kind
            progress(f"{lab.checks[record.key.check].name} [{record.key.world_size} ranks]: "
                     f"{how} at {time.monotonic() - start:.1f} s")

    harness = (lab.path / "harness.py").read_bytes()
    workdir = None
    try:  # the folder is made inside: a SIGTERM (cli's Stopped) landing just after leaves none
        workdir, code = prepare_workdir({**files, HARNESS: harness}, workbase)
        job = Job(module=lab.module, code=code, allowed=lab.info.allowed_ops,
                  refusal=lab.info.refusal(), forbidden=list(lab.info.forbidden_imports),
                  toolkit=list(lab.info.sandbox_modules), landlock=landlock,
                  sources={n: b.decode("utf-8", "replace") for n, b in files.items()},
                  device=device, gpus=",".join(str(g) for g in gpus or []) if device == "cuda"
                  else "", unconfined=unconfined)
        run = run_session(job, launches, limits, workdir, deadline=deadline,
                          on_record=on_record)
    finally:
        if workdir is not None:
            unmount_below(workdir)  # a launch's tmpfs, should a failure have skipped its cleanup
            remove(workdir)
    result.sandbox = run.sandbox
    if unconfined:
        result.notes.insert(0, f"{UNCONFINED}.")
        run.missing = [m for m in run.missing if m != UNCONFINED]
    refused = next((r.failure.message for r in run.records.values()
                    if r.failure is not None and r.failure.kind == "sandbox_unavailable"), "")
    if refused:
        result.notes.insert(0, f"This machine could not build the grader's sandbox, so no "
                               f"submission code ran and the score is zero: {refused}")
    if run.missing:
        result.notes.append(f"This grade ran without: {'; '.join(run.missing)}. The checks "
                            "ran, but the sandbox was weaker than designed (docs/grading.md).")
    result.checks = judge_run(lab, run.records, cases)
    forged = sorted({f for r in run.records.values() for f in r.forged})
    if forged:
        for c in result.checks:
            c.score, c.passed, c.kind = 0.0, 0, "forged_results"
            c.message = ("The submission wrote its own results.json "
                         f"({', '.join(forged)}); the grade is zero. The grader writes "
                         "results.json itself.")
    hit = [(r.key, r.failure.kind) for r in run.records.values()
           if r.failure is not None and r.failure.kind.endswith("_limit")]
    for key, kind in hit:
        result.notes.append(f"{lab.checks[key.check].name} [{key.world_size} ranks] hit "
                            f"{kind}; the other checks ran on fresh ranks (total budget "
                            f"{limits.wall_s:g} s).")
    late = sum(1 for r in run.records.values() for v in r.verdicts or []
               if v.kind == NOT_JUDGED and v.message.startswith("Not judged"))
    unrun = sum(1 for r in run.records.values()
                if r.failure is not None and r.failure.kind == "wall_limit")
    if late or unrun:
        result.notes.append(f"The grade's total budget{budget} ran out: {unrun} launch(es) "
                            f"not run and {late} case(s) not judged score zero; everything "
                            "judged before it is scored.")
    result.seconds = time.monotonic() - start
    return result


__all__ = ["CheckResult", "GradeResult", "case_seed", "grade", "max_ranks", "plan",
           "prepare_workdir"]
