"""Grade a class: every student's lab notebooks, each lab in a fresh, time-bounded, guarded process.

For one student and one lab, the engine reads the student's notebook with `ast` only (`extract`), writes a
job for `distlab.grading.child` into a new temporary folder, and starts that child there:

- its working folder, `HOME` and `TMPDIR` are inside that folder, and its `sitecustomize` is the write
  guard (`guard.py`), so no Python process it starts may write outside the folder;
- `RLIMIT_FSIZE` caps every file it writes (an endless print into a rank's output file stops there),
  `RLIMIT_CORE` is 0; bytecode is not written (`PYTHONDONTWRITEBYTECODE`); progress is not recorded;
- it writes one line when an exercise starts and one when it ends. An exercise that runs longer than
  `timeout` seconds ends as "timed out": the engine kills the child's process group and starts a fresh
  child for the lab's remaining exercises; a child that dies mid-exercise makes it "crashed", likewise.

Nothing of a run stays: the folder is removed afterwards. `guard.py` says what the guard cannot stop.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from distlab.grading import extract, guard
from distlab.grading.registry import Exercise

FILE_LIMIT = 64 * 2**20  # bytes any one file of a grading process may reach
OUTPUT_LIMIT = 100_000  # characters one exercise may print
VERDICTS = ("pass", "fail", "not written", "timed out", "crashed", "forbidden write")
START_LIMIT = 120.0  # seconds a child may take to import torch and the course before its first exercise


@dataclass
class Row:
    """One student x exercise of the report."""

    student: str
    lab: str
    exercise: str
    verdict: str
    failed: list[str] = field(default_factory=list)  # which kinds of cases failed: "public", "hidden"
    message: str = ""
    seconds: float = 0.0

    def as_dict(self) -> dict:
        return asdict(self)


def find_notebook(folder: Path, lab: str) -> Path | None:
    """The student's notebook of `lab` ("04_pipeline") in `folder`: its course name, else the one
    notebook whose name starts with the lab's number (backups of a reset are not it)."""
    exact = folder / f"{lab}.ipynb"
    if exact.is_file():
        return exact
    others = sorted(p for p in folder.glob(f"{lab[:2]}_*.ipynb") if ".before-reset" not in p.name)
    return others[0] if others else None


def read_lines(path: Path) -> list[dict]:
    """A child's results file so far: {"start": check} or a row per line; anything else (half a line, or
    what the student's code wrote there) is skipped."""
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if isinstance(item, dict) and (isinstance(item.get("start"), str) or isinstance(
                item.get("check"), str) and item.get("verdict") in VERDICTS):
            out.append(item)
    return out


def _limits() -> None:  # runs in the child before it executes Python
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_LIMIT, FILE_LIMIT))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _environment(root: Path) -> dict[str, str]:
    src = str(Path(__file__).resolve().parents[2])  # the folder that holds this distlab
    env = {k: v for k, v in os.environ.items() if k not in ("JPY_SESSION_NAME", "PYTHONSTARTUP")}
    env.update(HOME=str(root / "home"), TMPDIR=str(root / "tmp"), DISTLAB_PROGRESS="off",
               PYTHONDONTWRITEBYTECODE="1", MPLCONFIGDIR=str(root / "tmp"), MPLBACKEND="Agg",
               # torch's compile caches: inductor writes the folder it chose into os.environ, so a grader
               # started after any torch.compile would hand the child a path outside its folder
               TORCHINDUCTOR_CACHE_DIR=str(root / "tmp" / "torchinductor"),
               TRITON_CACHE_DIR=str(root / "tmp" / "triton"),
               PYTHONPATH=os.pathsep.join([str(root / "site"), src] + [p for p in [os.environ.get(
                   "PYTHONPATH", "")] if p]))
    env[guard.ROOT_ENV], env[guard.PROTECT_ENV] = str(root), str(os.getpid())
    return env


class _Child:
    """One grading process for a list of exercises, and what it has reported so far."""

    def __init__(self, root: Path, jobs: list[dict], hidden: bool) -> None:
        self.results = root / f"results-{time.monotonic_ns()}.jsonl"
        job = root / f"job-{time.monotonic_ns()}.json"
        job.write_text(json.dumps({"exercises": jobs, "hidden": hidden, "results": str(self.results),
                                   "output_limit": OUTPUT_LIMIT}))
        self.output = (root / "output.txt").open("ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "distlab.grading.child", str(job)],
                                     cwd=root / "work", env=_environment(root), stdin=subprocess.DEVNULL,
                                     stdout=self.output, stderr=subprocess.STDOUT, start_new_session=True,
                                     preexec_fn=_limits)
        self.began = time.monotonic()
        self.marks: dict[int, float] = {}  # line count -> seconds after the start when the engine saw it

    def lines(self) -> list[dict]:
        return read_lines(self.results)

    def tail(self) -> str:
        """The last line the child printed (at most 300 characters of it), for a crash's message."""
        with (self.results.parent / "output.txt").open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 2000))
            last = f.read().decode(errors="replace").strip().splitlines()
        return last[-1][:300] if last else ""

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        self.output.close()


def _watch(child: _Child, timeout: float) -> tuple[list[dict], dict | None]:
    """Wait until the child ends or an exercise overruns; its finished rows and the row of the exercise
    it was in when it stopped (timed out or crashed), if any."""
    while True:
        lines = child.lines()
        if child.proc.poll() is not None:
            return _ended(child)
        stopped = _overrun(child, lines, timeout)
        if stopped is not None:
            return _finished(lines), stopped
        time.sleep(0.1)


def _finished(lines: list[dict]) -> list[dict]:
    """The rows of the exercises that have a verdict."""
    return [x for x in lines if "verdict" in x]


def _current(lines: list[dict]) -> str | None:
    """The check the child started last and has not finished, if any."""
    return lines[-1]["start"] if lines and "start" in lines[-1] else None


def _ended(child: _Child) -> tuple[list[dict], dict | None]:
    """A child that exited: its finished rows, and a "crashed" row for the exercise it was in, if any."""
    child.kill()
    lines = child.lines()  # what it wrote just before it ended
    current = _current(lines)
    if current is None:
        return _finished(lines), None
    code = child.proc.returncode
    how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
    said = child.tail()
    message = f"the process ended ({how})" + (f"; its last output: {said}" if said else "")
    return _finished(lines), {"check": current, "verdict": "crashed", "message": message}


def _overrun(child: _Child, lines: list[dict], timeout: float) -> dict | None:
    """When the child has spent too long since its last line (`timeout`, or `START_LIMIT` before its
    first): kill it and return the row of the exercise it was in; else None."""
    since = child.began + _started_at(child, len(lines))  # when the engine saw the last line
    limit = timeout if lines else START_LIMIT
    if time.monotonic() - since <= limit:
        return None
    child.kill()
    current = _current(lines)
    what = "timed out" if current else "crashed"
    message = (f"still running after {timeout:g} s" if current else
               f"the grading process did not go on to this exercise within {limit:g} s")
    return {"check": current or "", "verdict": what, "message": message, "seconds": limit}


def _started_at(child: _Child, count: int) -> float:
    """Seconds after the child's start at which it wrote its `count`-th line (noted by the engine)."""
    return child.marks.setdefault(count, time.monotonic() - child.began)


def grade_lab(student: str, notebook: Path | None, exercises: list[Exercise], hidden: bool,
              timeout: float) -> list[Row]:
    """The rows of one student's lab: each exercise run in a guarded child (see the module docstring)."""
    rows: dict[str, Row] = {}
    jobs = []
    for ex in exercises:
        if notebook is None:
            rows[ex.check] = Row(student, ex.lab, ex.check, "not written", message="no notebook handed in")
            continue
        code = extract.student_code(notebook, ex.functions)
        if code.problem:
            rows[ex.check] = Row(student, ex.lab, ex.check, code.kind, message=code.problem)
            continue
        jobs.append({"lab": ex.lab, "check": ex.check, "functions": list(ex.functions), "call": ex.call,
                     "context": ex.context, "source": code.source})
    if jobs:
        for row in _run_jobs(jobs, hidden, timeout):
            rows[row["check"]] = Row(student, exercises[0].lab, row["check"], row["verdict"],
                                     row.get("failed", []), row.get("message", ""), row.get("seconds", 0.0))
    return [rows[ex.check] for ex in exercises]


def _run_jobs(jobs: list[dict], hidden: bool, timeout: float) -> list[dict]:
    """Run `jobs` in guarded children, a fresh one after each timeout or crash, until each has a row."""
    root = Path(tempfile.mkdtemp(prefix="distlab-grade-")).resolve()
    try:
        for sub in ("home", "tmp", "work", "site"):
            (root / sub).mkdir()
        shutil.copyfile(guard.__file__, root / "site" / "sitecustomize.py")
        out: list[dict] = []
        while jobs:
            rows, jobs = _run_child(root, jobs, hidden, timeout)
            out += rows
        return out
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _run_child(root: Path, jobs: list[dict], hidden: bool, timeout: float) -> tuple[list[dict], list[dict]]:
    """Run `jobs` in one guarded child until it ends or stops: the rows it gave, and the jobs left."""
    child = _Child(root, jobs, hidden)
    done, stopped = _watch(child, timeout)
    names = {j["check"] for j in jobs}
    rows = [x for x in done if x["check"] in names]
    jobs = [j for j in jobs if j["check"] not in {x["check"] for x in done}]
    more, jobs = _stopped_rows(stopped, jobs)
    return rows + more, jobs


def _stopped_rows(stopped: dict | None, jobs: list[dict]) -> tuple[list[dict], list[dict]]:
    """The rows a child's stop gives (`stopped`: its row, or None when it ended), and the jobs still left."""
    if stopped is None and jobs:
        stopped = {"check": "", "verdict": "crashed",
                   "message": "the grading process ended before this exercise started"}
    if stopped is None:
        return [], jobs
    if stopped["check"]:
        return [stopped], [j for j in jobs if j["check"] != stopped["check"]]
    # between two exercises: every exercise left shares the verdict
    return [{**stopped, "check": j["check"]} for j in jobs], []
