"""The measured columns of docs/grading.md's tables, written from the saved entries (`saved`).

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
