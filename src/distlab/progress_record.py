"""The student's progress file, the part every exercise check writes: where it lives, and `record`.

`distlab.checks.CheckResult` records each check's verdict here (under the name of the outermost
`check_...` function on the stack, `check_name`); `distlab.progress` (on the roof: it reads the labs and
the chapters' exercise modules) prints the file per lab and says where the file lives and why
(`DISTLAB_PROGRESS`, a lab with worked solutions, `~/.distlab/progress.json`). This file is on the
ground floor so that a check records without importing the roof.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import sys
import tempfile
from pathlib import Path

ENV = "DISTLAB_PROGRESS"
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
