"""The grading report: `grades.csv` and `grades.json` (one row per student x exercise) and `grades.html`,
a summary an instructor opens offline (one file, its style inline, no script, nothing fetched)."""

from __future__ import annotations

import csv
import html
import json
from collections.abc import Sequence
from pathlib import Path

from distlab.grading.engine import VERDICTS, Row

# each verdict's colour, in VERDICTS' order (Okabe-Ito, as distlab.style)
COLOURS = dict(zip(VERDICTS, ("#009E73", "#D55E00", "#999999", "#E69F00", "#CC79A7", "#000000"), strict=True))
FIELDS = ("student", "lab", "exercise", "verdict", "failed", "message", "seconds")


def write_csv(rows: Sequence[Row], path: Path) -> None:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(FIELDS)
        for r in rows:
            writer.writerow([r.student, r.lab, r.exercise, r.verdict, "+".join(r.failed), r.message,
                             r.seconds])


def write_json(rows: Sequence[Row], path: Path) -> None:
    path.write_text(json.dumps([r.as_dict() for r in rows], indent=1) + "\n")


def _cell(row: Row) -> str:
    kinds = f" ({'+'.join(row.failed)})" if row.failed and row.verdict != "pass" else ""
    tip = html.escape(row.message or row.verdict, quote=True)
    return (f"<td title=\"{tip}\" style=\"background:{COLOURS.get(row.verdict, '#fff')}\">"
            f"{html.escape(row.verdict)}{html.escape(kinds)}</td>")


def html_summary(rows: Sequence[Row]) -> str:
    """The offline summary: a table student x exercise, each cell its verdict (hover: the message), then
    every row that did not pass with its message."""
    exercises = list(dict.fromkeys((r.lab, r.exercise) for r in rows))
    students = list(dict.fromkeys(r.student for r in rows))
    by = {(r.student, r.lab, r.exercise): r for r in rows}
    head = "".join(f"<th>{html.escape(lab[:2])}<br>{html.escape(ex.removeprefix('check_'))}</th>"
                   for lab, ex in exercises)
    body = [_student_row(s, exercises, by) for s in students]
    details = "".join(_detail_row(r) for r in rows if r.verdict not in ("pass", "not written"))
    legend = " ".join(f"<span style=\"background:{c};color:#fff;padding:0 .4em\">{v}</span>"
                      for v, c in COLOURS.items())
    return ("<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>distlab grades</title><style>"
            "body{font-family:sans-serif;margin:1em}table{border-collapse:collapse;margin:1em 0}"
            "td,th{border:1px solid #ccc;padding:.2em .4em;font-size:90%;white-space:nowrap}"
            "td[title]{color:#fff;text-align:center}</style></head><body>"
            f"<h1>distlab grades</h1><p>{len(students)} students, {len(exercises)} exercises. {legend} "
            "(public / hidden: which kind of case failed; hover a cell for the check's message)</p>"
            f"<table><tr><th>student</th><th>pass</th>{head}</tr>{''.join(body)}</table>"
            f"<h2>What went wrong</h2>{_details_table(details)}</body></html>\n")


def _student_row(student: str, exercises: list[tuple[str, str]], by: dict[tuple[str, str, str], Row]) -> str:
    """One student's row of the summary: their count of passes, then a cell per exercise (empty if absent)."""
    mine = [by[(student, lab, ex)] for lab, ex in exercises if (student, lab, ex) in by]
    passed = sum(r.verdict == "pass" for r in mine)
    return (f"<tr><th>{html.escape(student)}</th><td>{passed} / {len(mine)}</td>"
            + "".join(_cell(by[(student, lab, ex)]) if (student, lab, ex) in by else "<td></td>"
                      for lab, ex in exercises) + "</tr>")


def _detail_row(r: Row) -> str:
    """A row that did not pass, with its message, for the table of what went wrong."""
    return (f"<tr><td>{html.escape(r.student)}</td><td>{html.escape(r.lab)}</td>"
            f"<td>{html.escape(r.exercise)}</td><td>{html.escape(r.verdict)}</td>"
            f"<td>{html.escape('+'.join(r.failed))}</td><td>{html.escape(r.message)}</td></tr>")


def _details_table(details: str) -> str:
    """The table of rows that did not pass, or a sentence when there are none."""
    if not details:
        return "<p>Nothing: every exercise handed in passed (the others were not written).</p>"
    return ("<table><tr><th>student</th><th>lab</th><th>exercise</th><th>verdict</th><th>cases</th>"
            f"<th>message</th></tr>{details}</table>")


def write(rows: Sequence[Row], out: Path) -> list[Path]:
    """Write the three files of the report into `out`; return their paths."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "grades.csv", out / "grades.json", out / "grades.html"]
    write_csv(rows, paths[0])
    write_json(rows, paths[1])
    paths[2].write_text(html_summary(rows))
    return paths


def table(rows: Sequence[Row]) -> str:
    """The short table `distlab check` prints: one line per exercise, then the count."""
    width = max((len(r.exercise) for r in rows), default=0)
    lines = [f"  {r.lab[:2]}  {r.exercise:<{width}}  {r.verdict}" + (f": {r.message}" if r.message and
                                                                      r.verdict != "pass" else "")
             for r in rows]
    passed = sum(r.verdict == "pass" for r in rows)
    return "\n".join(lines + [f"{passed} of {len(rows)} exercises pass their public cases"])
