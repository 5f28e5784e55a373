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
import atexit
import json
import os
import re
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

ENV = "DISTLAB_PROGRESS"
PASS, FAIL, NOT_WRITTEN, NOT_RUN = "pass", "fail", "not written", "not run yet"
PACKAGE = Path(__file__).resolve().parent
LABS = PACKAGE.parents[1] / "labs"  # the clone's labs (an editable install, as `make lab` makes)
_CALL = re.compile(r"\b(check_\w+)\(")
_LAB = re.compile(r"^(\d\d)_(\w+)\.ipynb$")
_SOLUTION = re.compile(r"^[ \t]*# BEGIN SOLUTION[ \t]*$", re.MULTILINE)  # distlab.student's marker
SESSION = "JPY_SESSION_NAME"  # jupyter_server sets it in a kernel's environment: the notebook's path


def progress_path() -> Path | None:
    """The progress file (`$DISTLAB_PROGRESS`, or ~/.distlab/progress.json), or None when it is off."""
    value = os.environ.get(ENV, "").strip()
    if value.lower() in ("off", "0", "no", "false", "none"):
        return None
    return Path(value).expanduser() if value else Path.home() / ".distlab" / "progress.json"


def holds_solutions(notebook: Path) -> bool:
    """True when a code cell of `notebook` holds a worked solution (a `# BEGIN SOLUTION` line), as the
    instructor's labs do and the student versions (`distlab.student`) never do."""
    try:
        text = notebook.read_text(encoding="utf-8")
        cells = json.loads(text).get("cells", []) if "# BEGIN SOLUTION" in text else []
    except (OSError, ValueError, AttributeError):
        return False
    return any(c.get("cell_type") == "code" and _SOLUTION.search("".join(c.get("source", "")))
               for c in cells)


def solutions_lab(folder: Path | None = None) -> Path | None:
    """The lab with worked solutions this process runs, or None (a student copy, a script, a test).

    The notebook JupyterLab names in `JPY_SESSION_NAME`; without it (nbval, nbconvert), a lab in `folder`
    (default: the working folder, where those start the kernel) that holds solutions."""
    session = os.environ.get(SESSION, "")
    if session.endswith(".ipynb"):
        candidates = [Path(session)]
    else:
        candidates = sorted((folder or Path.cwd()).glob("[0-9][0-9]_*.ipynb"))
    return next((lab for lab in candidates if holds_solutions(lab)), None)


def recording_path() -> Path | None:
    """Where this process's checks record, and what its lab's last cell reads: `progress_path()`, except
    in a lab with the worked solutions while `DISTLAB_PROGRESS` is unset, where it is a file of this
    process alone (in the temporary folder), so the solutions' passes never reach the student's record."""
    path = progress_path()
    if path is None or os.environ.get(ENV, "").strip() or solutions_lab() is None:
        return path
    return Path(tempfile.gettempdir()) / f"distlab-progress-instructor-{os.getpid()}.json"


def load(path: Path | None = None) -> dict[str, str]:
    """{check name: latest verdict} from the progress file ({} when there is none or it is unreadable)."""
    path = path or progress_path()
    if path is None or not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def record(check: str, verdict: str) -> None:
    """Store `verdict` for `check` (in `recording_path()`); never fails the check itself (an unwritable
    file is skipped)."""
    path = recording_path()
    if path is None:
        return
    if path != progress_path() and not path.exists():  # this kernel's own file: gone when it exits
        atexit.register(path.unlink, missing_ok=True)
        _sweep(path.parent)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        data = load(path)
        data[check] = verdict
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".progress-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
        os.replace(tmp, path)  # atomic: two kernels writing at once never leave half a file
    except OSError:
        pass


def _sweep(folder: Path) -> None:
    """Remove the kernel files of processes that are gone (a kernel that was killed runs no atexit)."""
    if os.name != "posix":  # os.kill(pid, 0) only asks on POSIX
        return
    for old in folder.glob("distlab-progress-instructor-*.json"):
        pid = old.stem.rsplit("-", 1)[-1]
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            old.unlink(missing_ok=True)
        except (ValueError, OSError):  # not ours to judge: another user's process, or not a pid
            continue


def check_name() -> str | None:
    """The name of the outermost `check_*` function of a distlab module on the call stack, or None."""
    name = None
    frame = sys._getframe(1)
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if module.startswith("distlab.") and frame.f_code.co_name.startswith("check_"):
            name = frame.f_code.co_name
        frame = frame.f_back
    return name


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
