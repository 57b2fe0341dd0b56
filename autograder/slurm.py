"""Batch grading on a SLURM cluster: ``autograder batch FOLDER --lab LAB --slurm [TASKS]``.

Nothing about grading changes; SLURM only spreads the work. The submissions (sorted, as
`batch.find_submissions` lists them) are dealt round-robin into TASKS parts (default: one per
submission; at most 1000, SLURM's default MaxArraySize), each part a folder of copies
under ``OUT/slurm/parts/I``. One job array runs, in array task I, the ordinary

    python -m autograder batch OUT/slurm/parts/I --lab LAB --jobs J --out OUT/slurm/results/I

``sbatch --wait`` returns when every task has ended; then `gather` moves each submission's
folder (results.json, report.txt) to ``OUT/NAME/`` and merges the parts' summary.csv into
``OUT/summary.csv``, rows sorted by submission as `run_batch` writes them. A submission whose
task left no result (a task killed by its time limit, a lost node) gets a results.json with
score 0 that says so, and the failure kind ``slurm_task_lost`` in the summary.

The job script is ``OUT/slurm/grade.sbatch`` (task I's output: ``OUT/slurm/task-I.out``).
Partition, account, time limit and CPUs go to sbatch: ``--sbatch="--partition=cpu --time=1:00:00
--cpus-per-task=4"`` on the command line, or sbatch's own ``SBATCH_PARTITION``,
``SBATCH_ACCOUNT``, ``SBATCH_TIMELIMIT`` environment variables.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from .batch import earlier_rows, find_submissions, write_summary

MAX_TASKS = 1000
ROOT = Path(__file__).resolve().parent.parent
LOST = "slurm_task_lost"


def split(submissions: list[Path], tasks: int) -> list[list[Path]]:
    """Round-robin: part i holds submissions i, i + n, i + 2n, ... (n parts, none empty)."""
    if isinstance(tasks, bool) or not isinstance(tasks, int) or tasks < 1:
        raise ValueError(f"--slurm TASKS must be an int >= 1, got {tasks!r}")
    n = min(tasks, len(submissions), MAX_TASKS)
    return [submissions[i::n] for i in range(n)]


def job_script(*, out: Path, lab_dir: Path, tasks: int, jobs: int, device: str = "cpu",
               gpus_per_grade: int | None = None) -> str:
    """The sbatch array script: task I runs `autograder batch` on part I. With `device` "cuda"
    or "auto" each task asks SLURM for `jobs` × `gpus_per_grade` GPUs on its node (--gres), and
    its batch command gets the same --device and --gpus-per-grade (the GPUs are only known on
    the compute node, so the node's own grader resolves them)."""
    q = shlex.quote
    if device not in ("cpu", "cuda", "auto"):
        raise ValueError(f"device must be 'cpu', 'cuda' or 'auto', got {device!r}")
    gpu = device != "cpu"
    if gpu and (isinstance(gpus_per_grade, bool) or not isinstance(gpus_per_grade, int)
                or gpus_per_grade < 1):
        raise ValueError(f"gpus_per_grade must be an int >= 1 with device {device!r}, got "
                         f"{gpus_per_grade!r}")
    gres = [f"#SBATCH --gres=gpu:{jobs * gpus_per_grade}"] if gpu else []
    flags = f" --device {device} --gpus-per-grade {gpus_per_grade}" if gpu else ""
    part = f"{out}/slurm/parts/$SLURM_ARRAY_TASK_ID"
    result = f"{out}/slurm/results/$SLURM_ARRAY_TASK_ID"
    return "\n".join([
        "#!/bin/bash",
        f"#SBATCH --job-name=grade-{lab_dir.name}",
        f"#SBATCH --array=0-{tasks - 1}",
        "#SBATCH --ntasks=1",
        *gres,
        f"#SBATCH --output={out}/slurm/task-%a.out",
        "# Written by `autograder batch --slurm` (autograder/slurm.py): task I grades the",
        "# submissions copied into parts/I with the ordinary batch command; the command that",
        "# submitted this gathers every part into summary.csv once all tasks have ended.",
        f"cd {q(str(ROOT))}",
        f'exec {q(sys.executable)} -m autograder batch "{part}" --lab {q(str(lab_dir))} '
        f'--jobs {jobs}{flags} --out "{result}"',
        "",
    ])


def _lost(target: Path, task: int, out: Path) -> dict:
    target.mkdir(parents=True, exist_ok=True)
    data = {"score": 0.0, "execution_time": 0, "tests": [],
            "output": f"The SLURM task that graded this submission (array task {task}) ended "
                      f"without a result; see {out}/slurm/task-{task}.out."}
    (target / "results.json").write_text(json.dumps(data, indent=2))
    return {"submission": target.name, "score": 0.0, "failures": LOST}


def gather(out: Path, parts: list[list[Path]], *, max_score: float) -> list[dict]:
    """Move each part's results into `out` and write `out`/summary.csv; returns the rows."""
    import pandas as pd

    tables = []
    for task, subs in enumerate(parts):
        results = out / "slurm" / "results" / str(task)
        summary = results / "summary.csv"
        table = pd.read_csv(summary, dtype={"submission": str}, keep_default_na=False) \
            if summary.is_file() else pd.DataFrame({"submission": []})
        graded = set(table.submission)
        for sub in subs:
            target = out / sub.stem
            if sub.stem in graded and (results / sub.stem / "results.json").is_file():
                if target.exists():
                    shutil.rmtree(target)
                shutil.move(str(results / sub.stem), str(target))
            else:
                table = table[table.submission != sub.stem]
                lost = {**_lost(target, task, out), "max_score": max_score}
                table = pd.concat([table, pd.DataFrame([lost])], ignore_index=True)
        tables.append(table)
    merged = pd.concat(tables, ignore_index=True).sort_values("submission", kind="stable")
    rows = merged.fillna("").to_dict("records")  # a part's missing columns: empty cells
    # An earlier batch's rows in this --out stay, as `run_batch` keeps them.
    write_summary(out / "summary.csv", rows + earlier_rows(out / "summary.csv",
                                                           {r["submission"] for r in rows}))
    return rows


def run_slurm_batch(folder: Path, lab_dir: Path, out: Path, *, tasks: int | None = None,
                    jobs: int = 1, max_score: float, sbatch_args: str = "",
                    device: str = "cpu", gpus_per_grade: int | None = None,
                    stream=sys.stderr) -> list[dict]:
    """Split, submit one job array, wait for it, gather (module docstring)."""
    if shutil.which("sbatch") is None:
        raise ValueError("--slurm needs SLURM's sbatch on PATH (run it on a cluster's login "
                         "node), or leave --slurm out to grade on this machine")
    out = Path(out).resolve()
    parts = split(find_submissions(folder), MAX_TASKS if tasks is None else tasks)
    work = out / "slurm"
    if work.exists():
        shutil.rmtree(work)  # a previous run's parts and results
    for i, subs in enumerate(parts):
        (work / "parts" / str(i)).mkdir(parents=True)
        (work / "results" / str(i)).mkdir(parents=True)
        for sub in subs:
            # Copied, links kept as links: the grader follows none (a link in a submission,
            # or a part that linked to it, would be refused as one).
            dst = work / "parts" / str(i) / sub.name
            if sub.is_dir() and not sub.is_symlink():
                shutil.copytree(sub, dst, symlinks=True)
            else:
                shutil.copy2(sub, dst, follow_symlinks=False)
    script = work / "grade.sbatch"
    script.write_text(job_script(out=out, lab_dir=Path(lab_dir).resolve(), tasks=len(parts),
                                 jobs=jobs, device=device, gpus_per_grade=gpus_per_grade))
    cmd = ["sbatch", "--wait", "--parsable", *shlex.split(sbatch_args), str(script)]
    stream.write(f"submitting {len(parts)} array task(s) for {sum(map(len, parts))} "
                 f"submissions: {shlex.join(cmd)}\n")
    stream.flush()
    done = subprocess.run(cmd, capture_output=True, text=True)
    job = done.stdout.strip().split(";")[0]
    if not job.isdigit():
        raise ValueError(f"sbatch refused the job array: {(done.stderr or done.stdout).strip()}")
    stream.write(f"job {job} ended (sbatch exit status {done.returncode}); gathering results\n")
    return gather(out, parts, max_score=max_score)


__all__ = ["LOST", "gather", "job_script", "run_slurm_batch", "split"]
