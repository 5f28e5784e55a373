"""The report of an exercise check: one `CaseResult` per world size or layout, gathered in a `CheckResult`.

A `CheckResult` prints as text, shows as a table in a notebook, and is truthy when every case passed, so
`assert check_...(fn)` works in a test. Every chapter's exercise checks return one.

The student version of a lab (`distlab.student`) replaces each solution by a stub that raises
`NotImplementedError`. Every check reports that stub the same way, as a failed case that says
`NOT_WRITTEN`, never as a traceback, whether the function ran here or inside ranks (where it comes back as
a `launch.RankError`): `is_stub(err)` recognises it and `not_written(label)` is the case. When every case
is the stub, the report says "not written yet" once, not once per case.

Every `CheckResult` made inside an exercise check (a `check_*` function of a distlab module) records its
verdict in the student's progress file (`distlab.progress_record`; `distlab progress` prints it).
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field

from distlab import progress_record

NOT_WRITTEN = "not written yet (it raises NotImplementedError)"


@dataclass
class CaseResult:
    """The outcome on one world size (or node layout): passed, and if not, the explanation lines."""

    label: str
    passed: bool
    lines: list[str] = field(default_factory=list)


@dataclass
class CheckResult:
    """The report of one exercise check; prints as text, shows as a table in a notebook.

    `bool(result)` is `result.passed`, so `assert check_ring_all_reduce(fn)` works in a test.
    """

    exercise: str
    cases: list[CaseResult]
    case_heading: str = "ranks"  # what one case is, for the notebook table's first column

    def __post_init__(self) -> None:
        check = progress_record.check_name()
        if check is not None:
            progress_record.record(check, self.verdict)

    @property
    def not_written(self) -> bool:
        """True when every case is the student version's unwritten stub (every line of every case says
        so: a check of several functions names each, "f: not written yet ...")."""
        return bool(self.cases) and all(not c.passed and c.lines and all(line.endswith(NOT_WRITTEN)
                                                                          for line in c.lines)
                                        for c in self.cases)

    def _stub_lines(self) -> list[str]:
        """What a report of stubs says, once: the distinct lines of its cases."""
        return list(dict.fromkeys(line for c in self.cases for line in c.lines))

    @property
    def verdict(self) -> str:
        """"pass", "fail" or "not written" (the word `distlab progress` shows)."""
        return "not written" if self.not_written else "pass" if self.passed else "fail"

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.cases)

    def __bool__(self) -> bool:
        return self.passed

    def __str__(self) -> str:
        verdict = "PASSED" if self.passed else "FAILED"
        good = sum(c.passed for c in self.cases)
        if self.not_written:
            lines = self._stub_lines()
            return "\n".join([f"{self.exercise}: {NOT_WRITTEN}"] * (lines == [NOT_WRITTEN])
                             or [f"{self.exercise}: not written yet"] + [f"  {line}" for line in lines])
        out = [f"{self.exercise}: {verdict} ({good} of {len(self.cases)} passed)"]
        for c in self.cases:
            out.append(f"  [{'pass' if c.passed else 'FAIL'}] {c.label}")
            out += [f"         {line}" for line in c.lines]
        return "\n".join(out)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        colour = "#009E73" if self.passed else "#D55E00"
        if self.not_written:
            return "<div>" + "<br>".join(
                f"<b style='color:{colour}'>{html.escape(line)}</b>" if k == 0 else html.escape(line)
                for k, line in enumerate(str(self).split("\n"))) + "</div>"
        # The book styles these tables in book/_static/distlab.css (its theme gives bare tables no padding).
        rows = "".join(
            f"<tr><td style='text-align:left'>{html.escape(c.label)}</td><td style='text-align:left;color:"
            f"{'#009E73' if c.passed else '#D55E00'}'>{'✓ pass' if c.passed else '✗ fail'}</td>"
            f"<td style='text-align:left'>{'<br>'.join(html.escape(line) for line in c.lines)}</td></tr>"
            for c in self.cases)
        return (f"<div><b style='color:{colour}'>{html.escape(self.exercise)}: "
                f"{'passed' if self.passed else 'failed'}</b><table><tr>"
                f"<th>{html.escape(self.case_heading)}</th><th>result</th>"
                f"<th style='text-align:left'>what is wrong</th></tr>{rows}</table></div>")

    def raise_if_failed(self) -> None:
        """Raise AssertionError carrying the whole report, unless every case passed."""
        if not self.passed:
            raise AssertionError(str(self))


def compare_guess(what: str, guess: float | None, model: float, measured: float | None = None,
                  fmt: str = "{:.3g}", measured_label: str = "measured") -> str:
    """The "predict first" row of a lab: the student's guess beside the model (and the measurement).

    `guess` is the number the student wrote down before running anything, or None while they have not
    (shown as "no guess yet"); the row then says how far the guess is from the model, as a ratio, so the
    output is the same on every machine when `measured` is left out (pass a measurement only in a cell
    whose output is tagged as a measurement).
    """
    if guess is not None and (isinstance(guess, bool) or not isinstance(guess, int | float)):
        raise ValueError(f"guess={guess!r} must be a number (or None before you have guessed); "
                         f"write your prediction for {what} as a number, e.g. 0.25")
    cells = [f"{what}", f"your guess {'no guess yet' if guess is None else fmt.format(guess)}",
             f"model {fmt.format(model)}"]
    if measured is not None:
        cells.append(f"{measured_label} {fmt.format(measured)}")
    if guess is not None and model:
        cells.append(f"guess / model = {guess / model:.2f}")
    return " | ".join(cells)


def is_stub(err: BaseException) -> bool:
    """True when `err` is a student's unwritten stub: a `NotImplementedError` raised here, or a failure
    of ranks (`launch.RankError`) whose failing rank's traceback ends in one."""
    if isinstance(err, NotImplementedError):
        return True
    lines = (getattr(err, "traceback", "") or "").strip().splitlines()
    return bool(lines) and lines[-1].startswith("NotImplementedError")


def not_written(label: str) -> CaseResult:
    """The failed case of a check whose function is still the stub: `NOT_WRITTEN`, nothing else."""
    return CaseResult(label, False, [NOT_WRITTEN])
