"""The grader's figures, written from the saved entries (`saved`): one sentence each, and the
measured columns of docs/grading.md's tables.

Sentences (as `figure_sentences`'): grading one submission and a class (benchmarks/grading.py),
starting one rank (rank_start.py), the grader's memory for each lab's reference and under the
corpus's attacks (grader_footprint.py), a grade's budget (grade_timeout.py). Tables:

* the courier's caps: the "reference solutions need" column, the most any lab's reference
  needed in one launch (benchmarks/grader_footprint.py, hidden checks included), the lab named;
* the judges' bounds: each attack's peak RSS, seconds and what it got, beside its lab's
  reference (``grader_footprint.py --fault LAB/NAME``);
* a timeout that holds: when each provocation's grade ended against its budget
  (benchmarks/grade_timeout.py), the whole table.

Rows are found by what they name (a cap, a fault), so the prose around the figures stays the
writers'; a row that names nothing measurable is refused (a figure with no source), and one
whose measurement is not saved yet says so. `benchmarks/figures_page.py` calls these.
"""

from __future__ import annotations

import re

from figure_sentences import plural, seconds, span

from toolkit.formats import human_bytes

Entries = dict[str, dict]
CAP_FIGURE = {"MAX_CALLS": ("calls", False), "RESULT_BYTES": ("returned", True),
              "MAX_STACKS": ("stacks", False), "KEEP_BYTES": ("kept", True),
              "HELD_BYTES": ("held", True), "OUTBOX_BYTES": ("outbox", True)}
"""The courier's cap a row names → (the footprint's figure for it, whether it is bytes)."""
NEED = "reference solutions need"
PROVOCATIONS = {"launch": "a launch that never ends (`sleep_forever`)",
                "judge": "a judge that sleeps ten minutes (a copy of lab 01)",
                "flood": "20,000 all-reduces in one backward (`traffic_flood`)"}
"""benchmarks/grade_timeout.py's provocations, as the table names them."""


def _table(old: str, column: str, region: str) -> tuple[list[str], list[str]]:
    """The table's lines in `old` and its header's cells; refused without a `column`."""
    lines = [line for line in old.strip().splitlines() if line.startswith("|")]
    if not lines or column not in lines[0]:
        raise ValueError(f"the {region} region holds no table with a '{column}' column")
    return lines, [c.strip() for c in lines[0].split("|")]


def courier(old: str, labs: Entries) -> str:
    """The caps table in `old` with its NEED column from `labs` (lab → footprint entry)."""
    lines, header = _table(old, NEED, "courier")
    column = header.index(NEED)
    for i, line in enumerate(lines[2:], start=2):
        cells = line.split("|")
        cap = next((c for c in CAP_FIGURE if f"`{c}`" in cells[column - 1]), None)
        if cap is None:
            raise ValueError(f"courier table row {i - 1} names none of {', '.join(CAP_FIGURE)}")
        key, in_bytes = CAP_FIGURE[cap]
        having = {lab: e for lab, e in labs.items() if key in e["figures"]}
        if not having:
            cells[column] = " not measured yet "
        else:
            lab, e = max(having.items(), key=lambda kv: kv[1]["figures"][key])
            n = e["figures"][key]
            cells[column] = f" {human_bytes(n) if in_bytes else f'{n:,}'} (lab {lab[:2]}) "
        lines[i] = "|".join(cells)
    return "\n".join(lines)


ROW_FAULT = re.compile(r"^\s*`([\w.-]+)`\s*\(lab (\d\d)\)")
"""A judges row opens with its fault and lab: `result_alias` (lab 01): ..."""


def judges(old: str, faults: Entries) -> str:
    """The attacks table in `old` with its RSS, seconds and outcome columns from `faults`
    ('fault LAB/NAME' → footprint entry with its reference's figures)."""
    lines, header = _table(old, "grader's peak RSS", "judges")
    for i, line in enumerate(lines[2:], start=2):
        cells = line.split("|")
        named = ROW_FAULT.match(cells[1])
        if named is None:
            raise ValueError(f"judges table row {i - 1} opens with no `fault` (lab NN)")
        name, lab = named.groups()
        entry = next((e for k, e in faults.items()
                      if k.startswith(f"fault {lab}") and k.endswith(f"/{name}")), None)
        if entry is None:
            cells[2:5] = [" not measured yet "] * 3
        else:
            f, ref = entry["figures"], entry["figures"]["reference"]
            cells[2] = f" {f['rss_mib']:,.0f} MiB ({ref['rss_mib']:,.0f}) "
            cells[3] = f" {f['seconds']:.1f} ({ref['seconds']:.1f}) "
            kinds = ", ".join(f"`{k}`" for k in f["kinds"]) or "no failure kind"
            cells[4] = f" {kinds}, {f['score']:g}/{f['max']:g} "
        lines[i] = "|".join(cells)
    return "\n".join(lines)


def timeout(entries: Entries) -> str | None:
    """The provocations' table: when each grade ended against its budget T."""
    rows = [(k, entries[k]["figures"]) for k in PROVOCATIONS if k in entries]
    if not rows:
        return None
    budgets = sorted({f["timeout_s"] for _, f in rows})
    lines = [f"| provocation | ended after (T = {' or '.join(f'{t:g}' for t in budgets)} s) | "
             "past T | results.json |", "|---|---|---|---|"]
    for key, f in rows:
        t = f["timeout_s"]
        past = ", ".join(f"{s - t:+.1f} s" if s > t else "inside" for s in f["took_s"])
        lines.append(f"| {PROVOCATIONS[key]} | {', '.join(f'{s:.1f} s' for s in f['took_s'])} "
                     f"| {past} | {'valid' if f['valid'] else 'INVALID'} |")
    return "\n".join(lines)


def grade_times(entries: Entries) -> str | None:
    labs = {k: e for k, e in entries.items() if k != "class"}
    if not labs:
        return None
    runs = [e["figures"]["runs"] for e in labs.values()]
    how = "one run each" if max(runs) == 1 else f"median of {span(runs, '{:d}')} runs"
    parts = [f"lab {k[:2]} {e['figures']['median_s']:.1f} s" for k, e in sorted(labs.items())]
    return (f"`autograder grade` of a lab's reference solution, end to end (a fresh process, "
            f"every visible and hidden check): {', '.join(parts)} ({how}).")


def grade_class(entries: Entries) -> str | None:
    if "class" not in entries:
        return None
    f = entries["class"]["figures"]
    mix = f["mix"]
    slow = ", then ".join(f"`{kind}` {s:.1f} s" for kind, s in f["slowest"])
    full = ("exactly the correct ones scored 100" if f["full_marks_are_the_correct"]
            else f"{f['full_marks']} scored 100 ({mix['correct']} are correct)")
    return (f"A class of {f['submissions']} lab-01 submissions ({mix['correct']} correct, "
            f"{mix['partial']} partial, {plural(mix['fault'], 'fault')} of the corpus) graded by "
            f"`autograder batch --jobs {f['jobs']}` took {seconds(f['seconds'])}: "
            f"{f['per_minute']:.1f} submissions per minute; a grade's median "
            f"{f['median_s']:.1f} s (correct ones {f['correct_median_s']:.1f} s, 90th "
            f"percentile {f['correct_p90_s']:.1f} s), the slowest {slow}; summary.csv held "
            + ("every submission" if f["every_submission"] else f"{f['rows']} rows") + ", and "
            f"{full}.")


def _labs(entries: Entries) -> dict[str, dict]:
    return {k: e for k, e in entries.items() if k[:2].isdigit()}


def footprint(entries: Entries) -> str | None:
    labs = _labs(entries)
    if not labs:
        return None
    f = [e["figures"] for e in labs.values()]
    return (f"Grading each lab's reference with its hidden checks (lab"
            f"{'s' if len(labs) > 1 else ''} {', '.join(k[:2] for k in sorted(labs))}), the "
            f"grader's peak RSS is "
            f"{span([x['rss_mib'] for x in f], '{:,.0f}')} MiB; the busiest launch needed "
            f"{max(x['calls'] for x in f):,} calls and marks and "
            f"{human_bytes(max(x['returned'] for x in f))} of results.")


def attacks(entries: Entries) -> str | None:
    """Faults of the corpus ('fault LAB/NAME', with their lab's reference beside them) and
    attacks ('attack NAME', lab 01), each graded on its lab's visible checks."""
    hits = {k: e for k, e in entries.items() if k.startswith(("fault ", "attack "))}
    if not hits:
        return None

    def one(key: str, f: dict) -> str:
        lab, _, name = key.split(" ", 1)[1].rpartition("/")
        ref = f.get("reference")
        return (f"`{name}`" + (f" (lab {lab[:2]})" if lab else "")
                + f" {f['rss_mib']:,.0f} MiB" + (f" (its lab's reference {ref['rss_mib']:,.0f})"
                                                 if ref else "")
                + f", {', '.join(f['kinds']) or 'no failure kind'}, {f['score']:g}/{f['max']:g}")

    return ("The grader's peak RSS grading attacks on a lab's visible checks, and what each got: "
            + "; ".join(one(k, e["figures"]) for k, e in sorted(hits.items())) + ".")


def grade_budget(entries: Entries) -> str | None:
    """benchmarks/grade_timeout.py: how far past `--timeout T` each provocation's grade ended."""
    names = {"launch": "a launch that never ends", "judge": "a judge that sleeps",
             "flood": "lab 02's traffic flood"}
    rows = [(names[k], entries[k]["figures"]) for k in names if k in entries]
    if not rows:
        return None
    budgets = sorted({f["timeout_s"] for _, f in rows})

    def ended(f: dict) -> str:
        past = [s - f["timeout_s"] for s in f["took_s"]]
        return (f"{span(past, '{:.1f}', ' to ')} s past T" if max(past) > 0
                else "inside T")

    return (f"With `grade --timeout T` (T = {' or '.join(f'{t:g}' for t in budgets)} s), "
            + ", ".join(f"{name} ended {ended(f)}" for name, f in rows)
            + f" ({plural(len(rows[0][1]['took_s']), 'run')} each, from the command's start "
            "to its exit).")


def rank_start(entries: Entries) -> str | None:
    if not entries:
        return None
    e = entries.get("as root") or next(iter(entries.values()))
    f = e["figures"]
    labs = f["labs"].values()
    return (f"Starting one rank as {f['who']}: a plain fork of a process holding torch "
            f"{f['plain_fork']['median_ms']:.0f} ms, the sandboxed rank (fork, namespaces, "
            f"world, uid) {f['sandboxed_rank']['median_ms']:.0f} ms, a fresh interpreter "
            f"importing torch {seconds(f['fresh_interpreter']['median_ms'] / 1e3)} (medians of "
            f"{f['plain_fork']['runs']}, {f['sandboxed_rank']['runs']} and "
            f"{f['fresh_interpreter']['runs']}); one grade starts "
            f"{span([x['ranks'] for x in labs], '{:d}')} ranks in "
            f"{span([x['launches'] for x in labs], '{:d}')} launches (labs "
            f"{', '.join(k[:2] for k in sorted(f['labs']))}).")

