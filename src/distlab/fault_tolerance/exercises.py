"""The check of lab 11's part-2 exercise: the useful fraction of a run whose replicas heal."""

from __future__ import annotations

from collections.abc import Callable

from distlab.checks import CaseResult, CheckResult, not_written
from distlab.fault_tolerance.goodput import healing_goodput

CASES = ((3600.0, 2.0, 1.0, 10.0, 8, 300.0), (86400.0, 0.5, 0.5, 5.0, 2, 0.0),
         (864.0, 2.0, 1.0, 10.0, 8, 300.0), (100.0, 10.0, 50.0, 100.0, 2, 1000.0))


def check_healing_fraction(fn: Callable[..., float]) -> CheckResult:
    """`fn(mtbf, step_s, detect, heal, replicas, replace)` must return the useful fraction
    1 - (t_d + t + (t_r + t_h) / R) / M, at least 0 (`goodput.healing_goodput`)."""
    cases = []
    for args in CASES:
        label = "M={:g} s, t={:g} s, t_d={:g} s, t_h={:g} s, R={}, t_r={:g} s".format(*args)
        want = healing_goodput(*args)["fraction"]
        try:
            got = fn(*args)
        except NotImplementedError:  # the student version's stub
            cases.append(not_written(label))
            continue
        ok = isinstance(got, int | float) and abs(got - want) <= 1e-9
        lines = [] if ok else [f"returned {got!r}; expected {want:.6f}: each failure costs t_d + t, and "
                               "(t_r + t_h) / R of the time, out of M; a fraction below 0 is 0"]
        cases.append(CaseResult(label, ok, lines))
    return CheckResult("the useful fraction of healing replicas", cases, case_heading="case")
