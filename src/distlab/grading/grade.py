"""The two commands: `distlab grade SUBMISSIONS/` (an instructor: every student, public and hidden cases, a
report) and `distlab check mylabs/` (a student: their own labs, the public cases, a short table).

SUBMISSIONS holds one folder per student, each with that student's lab notebooks (`04_pipeline.ipynb`, as
`make lab` names them); a lab that is missing counts as not written.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from distlab.grading import engine, registry, report
from distlab.grading.engine import Row
from distlab.grading.registry import Exercise

DEFAULT_TIMEOUT = 120.0


def _by_lab(exercises: Sequence[Exercise]) -> dict[str, list[Exercise]]:
    out: dict[str, list[Exercise]] = {}
    for ex in exercises:
        out.setdefault(ex.lab, []).append(ex)
    return out


def grade_class(found: Sequence[tuple[str, Path]], exercises: Sequence[Exercise], hidden: bool,
                timeout: float, jobs: int = 1) -> list[Row]:
    """Every exercise of every (name, folder of notebooks) in `found`, `jobs` labs at a time; the rows in
    the order of `found`, then of the course."""
    tasks = [(name, folder, lab, mine) for name, folder in found for lab, mine in _by_lab(exercises).items()]

    def one(task: tuple[str, Path, str, list[Exercise]]) -> list[Row]:
        name, folder, lab, mine = task
        return engine.grade_lab(name, engine.find_notebook(folder, lab), mine, hidden, timeout)

    with ThreadPoolExecutor(max_workers=jobs) as pool:  # each task waits on its own child process
        return [row for rows in pool.map(one, tasks) for row in rows]


def students(submissions: Path) -> list[tuple[str, Path]]:
    """(name, folder) of every student: each sub-folder of `submissions` (hidden ones skipped)."""
    return [(p.name, p) for p in sorted(submissions.iterdir()) if p.is_dir() and not p.name.startswith(".")]


def _timeout(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"--timeout {text}: give the seconds one exercise may run, e.g. 120")
    return value


def grade_main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="distlab grade", description="Grade a class: every student's lab "
                                     "notebooks, public and hidden cases, one report (CSV, JSON, HTML).")
    parser.add_argument("submissions", type=Path, help="a folder with one folder of notebooks per student")
    parser.add_argument("--out", type=Path, default=Path("_build/grades"),
                        help="where grades.csv, grades.json and grades.html go (default: _build/grades)")
    parser.add_argument("--timeout", type=_timeout, default=DEFAULT_TIMEOUT,
                        help=f"seconds one exercise may run, public and hidden cases together "
                             f"(default {DEFAULT_TIMEOUT:g})")
    parser.add_argument("--jobs", type=int, default=1,
                        help="labs graded at the same time (default 1; each starts its own processes)")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs {args.jobs}: give how many labs to grade at once, 1 or more")
    if not args.submissions.is_dir():
        parser.error(f"{args.submissions} is not a folder: give the folder that holds one folder per student")
    found = students(args.submissions)
    if not found:
        parser.error(f"{args.submissions} holds no student folders: put each student's notebooks in a "
                     "folder of their own, e.g. submissions/ada/04_pipeline.ipynb")
    print(f"grading {len(found)} students ...", flush=True)
    rows = grade_class(found, registry.exercises(), hidden=True, timeout=args.timeout, jobs=args.jobs)
    for path in report.write(rows, args.out):
        print(f"wrote {path}")
    return 0


def check_main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="distlab check", description="Run the public cases of every lab in "
                                     "a folder of your notebooks, as the grader will (before you hand in).")
    parser.add_argument("folder", type=Path, nargs="?", default=Path("mylabs"),
                        help="your notebooks (default: mylabs, where `make lab` put them)")
    parser.add_argument("--timeout", type=_timeout, default=DEFAULT_TIMEOUT,
                        help=f"seconds one exercise may run (default {DEFAULT_TIMEOUT:g})")
    parser.add_argument("--lab", help="one lab's number, e.g. 04 (default: every lab)")
    args = parser.parse_args(argv)
    if not args.folder.is_dir():
        parser.error(f"{args.folder} is not a folder: give the folder of your lab notebooks, e.g. mylabs")
    exercises = [e for e in registry.exercises() if args.lab is None or e.lab[:2] == args.lab]
    if not exercises:
        parser.error(f"--lab {args.lab}: no lab of this course has that number (e.g. --lab 04)")
    rows = grade_class([(args.folder.name, args.folder)], exercises, hidden=False, timeout=args.timeout)
    print(report.table(rows))
    return 0 if all(r.verdict == "pass" for r in rows) else 1
