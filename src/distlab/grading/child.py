"""The grading process of one student and one lab: `python -m distlab.grading.child JOB.json`.

`distlab.grading.engine` starts it in a fresh temporary folder, under the write guard (`guard.py`, its
`sitecustomize`). For each exercise of the job it runs, in this order and nothing else:

1. the exercise's trusted setup, taken from the course's own lab (`extract.context`);
2. the student's definitions for that exercise (`extract.student_code`: imports, functions, classes);
3. the lab's check call (the public cases), with the check itself from step 1, never the student's;
4. with `hidden`, the instructor-only cases (`hidden_cases.HIDDEN`).

It appends one JSON line to the results file when an exercise starts and one when it ends, so that the
engine knows which exercise a hang or a crash belongs to. What the exercise prints is capped
(`output_limit` characters, then the exercise ends as "crashed"); a rank that fails is noted through the
launcher (`_RankErrors`); an attempt to write outside the folder is read from the guard's log.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from distlab.grading import guard


class OutputLimit(BaseException):
    """Raised when an exercise prints more than its limit (a BaseException: a check's `except Exception`
    does not swallow it)."""


class _Capped:
    """A text stream that keeps nothing and raises `OutputLimit` past `limit` characters."""

    def __init__(self, limit: int) -> None:
        self.limit, self.count = limit, 0

    def write(self, text: str) -> int:
        self.count += len(text)
        if self.count > self.limit:
            raise OutputLimit(f"printed more than {self.limit} characters")
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


class _RankErrors:
    """Every `launch.RankError` of a `launch.run` call while open (the checks catch and explain them; the
    grader also needs to know that a rank crashed or hung)."""

    def __init__(self) -> None:
        self.errors: list[BaseException] = []

    @contextlib.contextmanager
    def recording(self) -> Iterator[_RankErrors]:
        from distlab import launch

        original = launch.run

        def run(*args: Any, **kwargs: Any) -> Any:
            try:
                return original(*args, **kwargs)
            except launch.RankError as err:
                self.errors.append(err)
                raise

        launch.run = run
        try:
            yield self
        finally:
            launch.run = original

    def verdict(self) -> tuple[str, str] | None:
        """("crashed" or "timed out", the first line of the error), for a failure that is not the stub."""
        from distlab.checks import is_stub

        for err in self.errors:
            if is_stub(err):
                continue
            first = (str(err).strip().splitlines() or [type(err).__name__])[0][:300]
            text = str(err).lower()
            return ("timed out" if "timed out" in text or "timeout" in text else "crashed"), first
        return None


def _display(*objects: Any, **_: Any) -> None:
    """IPython's display outside IPython: print."""
    for obj in objects:
        print(obj)


def _positional(call: str, namespace: dict) -> tuple:
    """The positional arguments of the lab's check call, evaluated in `namespace`."""
    node = ast.parse(call, mode="eval").body
    return tuple(eval(compile(ast.Expression(a), "<the lab's check call>", "eval"), namespace)
                 for a in node.args)


def _cases(result: Any) -> dict:
    """A check's result as plain data: verdict, and the first failing case's lines."""
    from distlab.checks import CheckResult

    if not isinstance(result, CheckResult):
        raise TypeError(f"the check returned {type(result).__name__}, not a CheckResult")
    bad = next((c for c in result.cases if not c.passed), None)
    message = "" if bad is None else f"{bad.label}: " + " ".join(line.strip() for line in bad.lines)
    return {"verdict": result.verdict, "message": message[:600],
            "cases": len(result.cases), "failed": sum(not c.passed for c in result.cases)}


def namespace(exercise: dict) -> dict[str, Any]:
    """Steps 1 and 2 of the module docstring: the names the lab's check call sees (the lab's setup, with
    the student's functions and nothing else of theirs)."""
    trusted: dict[str, Any] = {"__name__": "__main__", "display": _display}
    exec(compile(exercise["context"], f"<{exercise['lab']}: the lab's setup>", "exec"), trusted)
    student = dict(trusted)
    names = ", ".join(exercise["functions"])
    exec(compile(exercise["source"], f"<the student's {names}>", "exec"), student)
    return {**trusted, **{f: student[f] for f in exercise["functions"]}}


def public_result(exercise: dict, call_ns: dict[str, Any]) -> Any:
    """Step 3: the `CheckResult` of the lab's own check call (the public cases)."""
    return eval(compile(exercise["call"], "<the lab's check call>", "eval"), call_ns)


def hidden_result(exercise: dict, call_ns: dict[str, Any]) -> Any:
    """Step 4: the `CheckResult` of the exercise's hidden cases, or None when it has none."""
    from distlab.grading.hidden_cases import HIDDEN

    entry = HIDDEN.get(exercise["check"])
    if entry is None or entry.run is None:
        return None
    return entry.run(*_positional(exercise["call"], call_ns))


def run_exercise(exercise: dict, hidden: bool) -> dict:
    """Steps 1-4 of the module docstring for one exercise; the public and hidden results."""
    call_ns = namespace(exercise)
    out = {"public": _cases(public_result(exercise, call_ns))}
    if hidden and out["public"]["verdict"] != "not written":
        result = hidden_result(exercise, call_ns)
        if result is not None:
            out["hidden"] = _cases(result)
    return out


def _forbidden(log: Path, offset: int) -> list[str]:
    if not log.is_file():
        return []
    return log.read_bytes()[offset:].decode(errors="replace").splitlines()


def verdict(out: dict, ranks: tuple[str, str] | None, forbidden: list[str]) -> dict:
    """One exercise's row: forbidden write, not written, crashed / timed out (a rank), fail or pass."""
    public, hidden = out["public"], out.get("hidden")
    failed = [kind for kind, r in (("public", public), ("hidden", hidden)) if r and r["verdict"] != "pass"]
    message = next((r["message"] for r in (public, hidden) if r and r["verdict"] != "pass"), "")
    if forbidden:
        return {"verdict": "forbidden write", "failed": failed, "message": forbidden[0]}
    if public["verdict"] == "not written":
        return {"verdict": "not written", "failed": [], "message": ""}
    if failed and ranks is not None:
        return {"verdict": ranks[0], "failed": failed, "message": f"{ranks[1]} ({message})"[:600]}
    return {"verdict": "fail" if failed else "pass", "failed": failed, "message": message}


def main(job_path: str) -> None:
    job = json.loads(Path(job_path).read_text())
    results = Path(job["results"])
    log = Path(os.environ.get(guard.ROOT_ENV, ".")) / guard.LOG_NAME
    import torch  # noqa: F401  (imported before the clock of the first exercise starts)

    import distlab.checks
    import distlab.launch  # noqa: F401

    for exercise in job["exercises"]:
        with results.open("a") as f:
            f.write(json.dumps({"start": exercise["check"]}) + "\n")
        offset, started = log.stat().st_size if log.is_file() else 0, time.monotonic()
        ranks = _RankErrors()
        capped = _Capped(job["output_limit"])
        try:
            with ranks.recording(), contextlib.redirect_stdout(capped), contextlib.redirect_stderr(capped):
                row = verdict(run_exercise(exercise, job["hidden"]), ranks.verdict(), _forbidden(log, offset))
        except (Exception, OutputLimit, SystemExit) as err:  # the student's code broke the check itself
            forbidden = _forbidden(log, offset)
            row = ({"verdict": "forbidden write", "failed": [], "message": forbidden[0]} if forbidden else
                   {"verdict": "crashed", "failed": [], "message": f"{type(err).__name__}: {err}"[:600]})
        row.update(check=exercise["check"], seconds=round(time.monotonic() - started, 1))
        with results.open("a") as f:
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
