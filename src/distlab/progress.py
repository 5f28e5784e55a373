"""The student's progress: every exercise check records its verdict in a small local file.

Each `distlab.checks.CheckResult` an exercise check returns is recorded here under the name of the check
function (`check_ring_all_reduce`) as "pass", "fail" or "not written" (the student version's stub).
`distlab progress` (and the last cell of every lab) prints, per lab, each exercise's latest verdict; an
exercise whose check never ran shows as "not run yet".

Where the file lives:
- `DISTLAB_PROGRESS=/some/file.json`: there (`make test` points it at a temporary file, and so do the
  tests, so that running the course's own solutions never overwrites a student's record);
- `DISTLAB_PROGRESS=off`: nothing is recorded (`make lab-instructor` sets it: the worked solutions pass);
- unset: `~/.distlab/progress.json`, in the home folder, never in the clone.

A lab that holds its worked solutions (the instructor's copies in the clone's `labs/`, between
`# BEGIN SOLUTION` and `# END SOLUTION`; the student's copies never do) never writes the student's file: with
`DISTLAB_PROGRESS` unset, its checks record in a file of that kernel alone, in the temporary folder, so its
last cell still shows what that run's checks said (`recording_path`). Which notebook a kernel runs is the one
JupyterLab names in `JPY_SESSION_NAME`; nbval and nbconvert name none but start the kernel in the
notebook's folder, so there any lab in the working folder that holds solutions counts.

Which exercises a lab has is read from the lab itself (the `check_...(` calls in its code cells) and the
chapters' exercise modules (the `def check_...` in files named `*exercises.py`), without importing them.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
from collections.abc import Sequence
from pathlib import Path

# where the file lives and `record`, which every check calls (the ground floor; re-exported here)
from distlab.progress_record import (  # noqa: F401
    ENV,
    SESSION,
    check_name,
    holds_solutions,
    load,
    progress_path,
    record,
    recording_path,
    solutions_lab,
)

PASS, FAIL, NOT_WRITTEN, NOT_RUN = "pass", "fail", "not written", "not run yet"
PACKAGE = Path(__file__).resolve().parent
LABS = PACKAGE.parents[1] / "labs"  # the clone's labs (an editable install, as `make lab` makes)
_CALL = re.compile(r"\b(check_\w+)\(")
_LAB = re.compile(r"^(\d\d)_(\w+)\.ipynb$")


def exercise_checks(package: Path = PACKAGE) -> set[str]:
    """The `check_*` functions defined in the chapters' exercise modules (files named *exercises.py)."""
    names: set[str] = set()
    for path in package.rglob("*exercises.py"):
        tree = ast.parse(path.read_text())
        names |= {node.name for node in ast.walk(tree)
                  if isinstance(node, ast.FunctionDef) and node.name.startswith("check_")}
    return names


def lab_exercises(labs: Path = LABS) -> dict[str, list[str]]:
    """{lab name ("01_collectives"): its exercise checks, in the order the lab first calls them}."""
    known = exercise_checks()
    out: dict[str, list[str]] = {}
    for path in sorted(labs.glob("[0-9][0-9]_*.ipynb")) if labs.is_dir() else []:
        cells = json.loads(path.read_text()).get("cells", [])
        code = "\n".join("".join(c["source"]) for c in cells if c.get("cell_type") == "code")
        out[path.stem] = [n for n in dict.fromkeys(_CALL.findall(code)) if n in known]
    return out


def report(lab: str | None = None, labs: Path = LABS, path: Path | None = None) -> str:
    """Per lab, each exercise and its latest verdict; `lab` ("04" or "04_pipeline") shows one lab only.
    `path`: the progress file to read (default: `recording_path()`, this process's)."""
    path = path or recording_path()
    if path is None:
        return f"progress is not recorded here ({ENV}=off)"
    done = load(path)
    table = lab_exercises(labs)
    if lab is not None:
        table = _pick_lab(table, lab)
    lines = []
    for name, checks in table.items():
        if checks:
            lines += _lab_lines(name, checks, done)
    if lab is None:
        lines.append(_where(path))
    return "\n".join(lines)


def _where(path: Path) -> str:
    """The report's last line: where these verdicts are recorded."""
    if path != progress_path():
        return "(a lab with the worked solutions: recorded for this kernel only, never as your progress)"
    if path.is_relative_to(Path.home()):
        return f"(recorded in ~/{path.relative_to(Path.home())})"
    return f"(recorded in {ENV})"


def _pick_lab(table: dict[str, list[str]], lab: str) -> dict[str, list[str]]:
    """The entry of lab `lab` ("04" or "04_pipeline"); a ValueError listing the labs if there is none."""
    picked = {k: v for k, v in table.items() if k == lab or k.split("_")[0] == lab}
    if not picked:
        raise ValueError(f"lab={lab!r} is not a lab of this course; use its number, e.g. '04' "
                         f"(labs: {', '.join(k.split('_')[0] for k in table) or 'none found'})")
    return picked


def _lab_lines(name: str, checks: list[str], done: dict[str, str]) -> list[str]:
    """One lab: how many of its exercises pass, then each exercise and its latest verdict."""
    verdicts = [done.get(c, NOT_RUN) for c in checks]
    passed = sum(v == PASS for v in verdicts)
    number, _, topic = name.partition("_")
    lines = [f"lab {number} ({topic.replace('_', ' ')}): {passed} of {len(checks)} exercises pass"]
    width = max(len(c) for c in checks)
    return lines + [f"  {c:<{width}}  {v}" for c, v in zip(checks, verdicts, strict=True)]


def show(lab: str) -> None:
    """Print one lab's progress: the last cell of every lab calls this."""
    print(report(lab))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="distlab progress", description=__doc__.split("\n")[0])
    parser.add_argument("lab", nargs="?", help="one lab's number, e.g. 04 (default: every lab)")
    args = parser.parse_args(argv)
    try:
        print(report(args.lab, path=progress_path()))
    except ValueError as err:
        parser.error(str(err))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
