"""Grade one submission of one lab: run its checks in the sandbox, judge them here.

    lab = load_lab(find_lab("01_collectives"))
    result = grade(lab, Path("submission/"))
    result.score, result.max_score; write_results(result, Path("results.json"))

Order of events: find the student files (missing → every check zero); parse them here
(`compile`, which runs nothing: a syntax error is reported with its line without starting
anything); run every check's cases in one sandboxed run (`autograder.runner`); then, in this
process, decode each rank's outputs and ask each check's judge. Integrity comes first: a case
whose ranks changed torch.distributed's functions, loaded a forbidden module, used a built-in
collective, or wrote far more bytes than their recorded messages fails whatever its values; a
results.json written by the submission zeroes the grade.
"""

from __future__ import annotations

import ast
import time
from dataclasses import dataclass, field
from pathlib import Path

from .failures import classify
from .lab import CaseResult, Check, Lab, Verdict, decode
from .runner import RunResult, prepare_workdir, remove_workdir, run_sandboxed
from .sandbox.limits import Limits

UNRECORDED_SLACK_BYTES = 512
UNRECORDED_PER_MESSAGE = 128
"""Bytes a rank may write beyond its recorded messages and prints in one case: a constant plus
this much per recorded message (and 1 % of the bytes sent). Measured over every case of lab 01's
reference (torch 2.13, gloo over TCP): exactly 96 bytes per send and 48 per receive, nothing
else. A built-in all_reduce of 8 floats called through the wrapper's ``__wrapped__`` (no
recorded message) writes 600+ bytes, so even the smallest hidden collective shows."""
UNRECORDED_PER_COLLECTIVE = 1024
"""Per allowed collective call and rank of the group: gloo's headers and algorithm rounds, on
top of twice p times its recorded payload (labs that allow collectives)."""


@dataclass
class CheckResult:
    check: Check
    score: float
    passed: int
    total: int
    kind: str | None = None
    """The failure kind (autograder.failures.KINDS) when the check failed for a named reason."""
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.passed == self.total


@dataclass
class GradeResult:
    lab: Lab
    submission: str
    checks: list[CheckResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    sandbox: str = ""

    @property
    def score(self) -> float:
        return round(sum(c.score for c in self.checks), 2)

    @property
    def max_score(self) -> float:
        return self.lab.max_score


def _files(lab: Lab, submission: Path) -> tuple[dict[str, bytes], list[str]]:
    wanted, found = list(lab.info.student_files), {}
    if submission.is_file():
        if submission.name in wanted or len(wanted) == 1:
            name = submission.name if submission.name in wanted else wanted[0]
            found[name] = submission.read_bytes()
    elif submission.is_dir():
        for name in wanted:
            hits = [submission / name] + sorted(submission.rglob(name))
            hit = next((h for h in hits if h.is_file()), None)
            if hit is not None:
                found[name] = hit.read_bytes()
    return found, [n for n in wanted if n not in found]


def _syntax(files: dict[str, bytes]) -> str | None:
    for name, source in files.items():
        try:
            tree = ast.parse(source, filename=name)
            compile(tree, name, "exec")
        except SyntaxError as err:
            return f"{name} line {err.lineno}: {err.msg}" + (
                f"\n    {err.text.rstrip()}" if err.text else "")
        except ValueError as err:  # null bytes
            return f"{name}: {err}"
    return None


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


def _cases(ci: int, check: Check) -> list[dict]:
    """Check number `ci`'s cases as the sandbox runs them: with ids unique in the lab."""
    return [dict(case, id=f"c{ci}-{k}", call=check.call) for k, case in enumerate(check.cases)]


def build_job(lab: Lab) -> dict:
    """The sandbox's job: one group per (check, world size), with globally unique case ids."""
    groups = []
    for ci, check in enumerate(lab.checks):
        by_size: dict[int, list[dict]] = {}
        for case in _cases(ci, check):
            by_size.setdefault(case["world_size"], []).append(case)
        for ws, cases in sorted(by_size.items()):
            groups.append({"id": f"c{ci}-p{ws}", "check": f"c{ci}", "world_size": ws,
                           "timeout": check.timeout, "cases": cases})
    return {"lab": lab.info.slug, "module": lab.module,
            "forbidden_imports": list(lab.info.forbidden_imports),
            "sandbox_modules": list(lab.info.sandbox_modules), "groups": groups}


def _integrity(traffic: list[dict], allowed: tuple[str, ...] = ()) -> tuple[str, str] | None:
    """A reason to fail the case whatever its values, or None. `allowed`: built-in collectives
    the lab permits; their wire traffic is not recorded byte for byte (gloo's algorithms move
    up to about p times the bytes passed in), so it widens the unrecorded-bytes allowance."""
    p = len(traffic)
    for rank, t in enumerate(traffic):
        if t.get("tampered"):
            return "tampering", (f"Rank {rank} replaced {', '.join(t['tampered'][:3])}: "
                                 "torch.distributed and the grader's recorder must stay as they "
                                 "are, so that the recorder sees and counts every message.")
        if t.get("forbidden_loaded"):
            return "forbidden_import", f"Rank {rank} used {', '.join(t['forbidden_loaded'])}."
        banned = [op for op in t.get("builtin_ops") or [] if op not in allowed]
        if banned:
            may = (f" (this lab allows {', '.join(allowed)})" if allowed else
                   ": this lab asks you to build it from send/recv (or isend/irecv) only")
            return "builtin_collective", (f"Rank {rank} called torch's built-in "
                                          f"{', '.join(banned)}{may}.")
        unrecorded = (t.get("wchar", 0) - t.get("printed", 0) - t.get("bytes_sent", 0)
                      - 2 * p * t.get("collective_bytes", 0))
        messages = t.get("messages_sent", 0) + t.get("messages_received", 0)
        collectives = sum(n for op, n in (t.get("calls") or {}).items() if op in allowed)
        if unrecorded > (UNRECORDED_SLACK_BYTES + UNRECORDED_PER_MESSAGE * messages
                         + UNRECORDED_PER_COLLECTIVE * p * collectives
                         + t.get("bytes_sent", 0) // 100):
            return "tampering", (
                f"Rank {rank} wrote {unrecorded:,} bytes that no recorded message accounts "
                "for (communication hidden from the recorder, or files used to share data).")
    return None


def _judge_group(ci: int, check: Check, lab: Lab, record: dict,
                 world_size: int) -> list[Verdict | tuple[str, str]]:
    """Verdicts for the cases of `check` at `world_size` (the ones this group's record ran)."""
    ranks = record.get("ranks")
    if not isinstance(ranks, list) or not ranks:
        return [("exception", "The ranks returned no observations.")]
    by_case: dict[str, list[dict]] = {}
    for rank_obs in ranks:
        for obs in rank_obs if isinstance(rank_obs, list) else []:
            if isinstance(obs, dict):
                by_case.setdefault(str(obs.get("case")), []).append(obs)
    out = []
    for case in (c for c in _cases(ci, check) if c["world_size"] == world_size):
        obs = sorted(by_case.get(case["id"], []), key=lambda o: o.get("rank", 0))
        ws = case["world_size"]
        if len(obs) != ws:
            out.append(("exception", f"case {case['id']}: {len(obs)} of {ws} ranks reported"))
            continue
        traffic = [{k: v for k, v in o.items() if k not in ("output", "case")} for o in obs]
        bad = _integrity(traffic, lab.info.allowed_collectives)
        if bad:
            out.append(bad)
            continue
        params = {k: v for k, v in case.items() if k not in ("id", "call")}
        result = CaseResult(params, ws, lab.harness.make_inputs(params, ws),
                            [decode(o.get("output")) for o in obs], traffic)
        try:
            out.append(check.judge(result))
        except Exception as err:  # a judge must not crash a grade on strange outputs
            out.append(Verdict(False, f"the output could not be checked ({type(err).__name__}: "
                                      f"{err}); does it return the right type and shape?"))
    return out


def _score(check: Check, verdicts: list, group_kind: tuple[str, str] | None) -> CheckResult:
    passed = sum(1 for v in verdicts if isinstance(v, Verdict) and v.passed)
    total = len(check.cases)
    failed = [v for v in verdicts if not (isinstance(v, Verdict) and v.passed)]
    kind, message = (None, "")
    if group_kind:
        kind, message = group_kind
    elif failed:
        first = failed[0]
        kind, message = (first if isinstance(first, tuple) else ("wrong_result", first.message))
    score = round(check.points * passed / total, 2) if total else 0.0
    return CheckResult(check, score, passed, total, kind if passed < total else None, message)


def judge_run(lab: Lab, run: RunResult) -> list[CheckResult]:
    results = []
    for ci, check in enumerate(lab.checks):
        verdicts: list = []
        group_kind = None
        sizes = sorted({c["world_size"] for c in check.cases})
        for ws in sizes:
            n_cases = sum(1 for c in check.cases if c["world_size"] == ws)
            record = run.records.get(f"c{ci}-p{ws}")
            if record is None:
                kind = run.limit or ("crash" if run.exit_code else "skipped")
                detail = run.limit_detail or (
                    "The sandbox stopped before this check ran." + (
                        f" It printed: {run.output.strip()[-300:]}" if run.output.strip() else ""))
                group_kind = group_kind or (kind, detail)
                verdicts += [(kind, detail)] * n_cases
            elif record.get("status") == "ok":
                verdicts += _judge_group(ci, check, lab, record, ws)
            else:
                log = run.log_tail.get(f"c{ci}-p{ws}", "").strip()
                kind = classify(record, lab.module, log)
                if kind[0] == "exception" and log:
                    kind = (kind[0], kind[1] + f"\nWhat the ranks printed last:\n{log[-800:]}")
                group_kind = group_kind or (kind[0], f"[{ws} ranks] {kind[1]}")
                verdicts += [kind] * n_cases
        printed = sum(run.log_bytes.get(f"c{ci}-p{ws}", 0) for ws in sizes)
        if run.limit == "output_limit" and printed and not group_kind:
            group_kind = ("output_limit", run.limit_detail)
        results.append(_score(check, verdicts, group_kind))
    return results


def grade(lab: Lab, submission: Path, *, limits: Limits | None = None, landlock: bool = True,
          workbase: Path | None = None) -> GradeResult:
    """Grade `submission` (a folder or a single file) against every check of `lab`."""
    start = time.monotonic()
    submission = Path(submission)
    result = GradeResult(lab, str(submission))
    files, missing = _files(lab, submission)

    def zero_all(kind: str, message: str) -> GradeResult:
        result.checks = [CheckResult(c, 0.0, 0, len(c.cases), kind, message) for c in lab.checks]
        result.seconds = time.monotonic() - start
        return result

    if missing:
        return zero_all("missing_file", f"The submission has no {', '.join(missing)} "
                                        f"(looked in {submission}).")
    error = _syntax(files)
    if error:
        return zero_all("syntax_error", f"Syntax error in {error}")
    defined = _defined_names(files[lab.info.student_files[0]])
    absent = [n for n in lab.info.names if n not in defined]
    if absent:
        result.notes.append(f"Not defined at the top level of {lab.info.student_files[0]}: "
                            f"{', '.join(absent)} (the checks that call them will fail).")
    workdir = prepare_workdir({**files, "_lab_harness.py": (lab.path / "harness.py").read_bytes()},
                              workbase)
    try:
        run = run_sandboxed(workdir, build_job(lab), limits or Limits(), landlock=landlock)
    finally:
        remove_workdir(workdir)
    result.sandbox = run.sandbox
    result.checks = judge_run(lab, run)
    if run.forged:
        for c in result.checks:
            c.score, c.passed, c.kind = 0.0, 0, "forged_results"
            c.message = ("The submission wrote its own results.json "
                         f"({', '.join(run.forged)}); the grade is zero. The grader writes "
                         "results.json itself.")
    if run.limit:
        result.notes.append(f"The run was stopped: {run.limit} ({run.limit_detail}).")
    result.seconds = time.monotonic() - start
    return result


__all__ = ["CheckResult", "GradeResult", "build_job", "grade", "judge_run"]
