"""Check for chapter 3's exercise: the admission rule of Stale Synchronous Parallel.

`check_may_start(fn)` tests the student's `fn(clock, clocks, staleness) -> bool` (may a worker at `clock`
start its next step, given every live worker's clock, its own included?) in two ways:

1. on a table of cases, each chosen to catch one mistake: `<` instead of `<=` (which makes s = 0
   deadlock), comparing with the fastest worker instead of the slowest, forgetting that the worker's own
   clock is in `clocks`, treating infinity (async) badly;
2. inside the schedule simulation (`schedule.simulate`) on sync, SSP and async runs with a straggler,
   where a wrong rule shows its consequence: a deadlock, or a gradient staler than SSP allows.

It runs in this process (no ranks): the rule is pure bookkeeping.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from distlab.async_sgd.cost_model import version_staleness_bound
from distlab.async_sgd.simulate import Deadlock, simulate
from distlab.async_sgd.ssp import may_start
from distlab.checks import CaseResult, CheckResult, is_stub, not_written

# (clock, clocks, staleness, what a wrong answer means)
CASES: tuple[tuple[int, tuple[int, ...], float, str], ...] = (
    (3, (3, 3, 3), 0, "every worker at the same clock must be allowed to go on, even with s = 0 "
                      "(compare with <=, not <: otherwise synchronous training deadlocks)"),
    (4, (3, 4, 4), 0, "with s = 0 a worker one clock ahead of the slowest must wait"),
    (5, (3, 5, 4), 2, "a worker exactly s clocks ahead of the slowest may go on (c - min <= s)"),
    (6, (3, 6, 4), 2, "a worker s + 1 clocks ahead of the slowest must wait"),
    (4, (4, 9, 9), 1, "the slowest worker itself may always go on, however far the others are ahead "
                      "(compare with the minimum clock, not the maximum)"),
    (2, (2, 0, 1), 1, "the bound is on the gap to the slowest live worker (min(clocks)), not to the "
                      "average or to the next one"),
    (50, (0, 50, 50), math.inf, "with s = infinity (fully asynchronous) no one ever waits"),
    (0, (0,), 0, "a single worker must always be allowed to go on"),
)


def _scenarios() -> list[tuple[str, Sequence[float], float]]:
    return [("sync", (3.0, 1.0, 1.0), 0), ("ssp", (3.0, 1.0, 1.0), 1), ("ssp", (4.0, 1.0, 1.0, 2.0), 2),
            ("async", (3.0, 1.0, 1.0), math.inf)]


def _recording(fn: Callable[[int, Sequence[int], float], bool], seen: list[str]):
    """The student's rule, noting in `seen` the first decision that differs from SSP's."""

    def rule(c: int, cl: Sequence[int], t: float) -> bool:
        got, want = bool(fn(c, list(cl), t)), may_start(c, cl, t)
        if got != want and not seen:  # the first wrong decision tells the story
            verdict = "let it start" if got else "kept it waiting"
            seen.append(f"{verdict} when a worker at clock {c} asked while the slowest was at {min(cl)} "
                        f"(gap {c - min(cl)}, threshold {t})")
        return got

    return rule


def _rule_case(fn: Callable, clock: int, clocks: Sequence[int], s: float, meaning: str) -> CaseResult:
    """One call of the rule beside SSP's answer."""
    label = f"may_start({clock}, {list(clocks)}, {s})"
    try:
        got = fn(clock, list(clocks), s)
    except Exception as e:  # report any mistake
        return not_written(label) if is_stub(e) else CaseResult(label, False,
                                                                [f"raised {type(e).__name__}: {e}"])
    want = may_start(clock, clocks, s)
    ok = isinstance(got, (bool, int)) and bool(got) == want
    return CaseResult(label, ok, [] if ok else [f"returned {got!r}, expected {want}: {meaning}"])


def _simulated_case(fn: Callable, mode: str, times: Sequence[float], s: float) -> CaseResult:
    """A whole simulated run with the rule: no deadlock, no call that differs, staleness within the bound."""
    label = f"simulated {mode} run{f' with s = {s}' if mode == 'ssp' else ''}, step times {times}"
    seen: list[str] = []
    try:
        steps = simulate(mode, times, 8, s if mode == "ssp" else math.inf, rule=_recording(fn, seen))
    except Deadlock as e:
        return CaseResult(label, False, [f"the rule deadlocks: {e}"])
    except Exception as e:  # report any mistake
        return not_written(label) if is_stub(e) else CaseResult(label, False, [f"the rule raised "
                                                                               f"{type(e).__name__}: {e}"])
    bound = version_staleness_bound(len(times), {"sync": 0, "ssp": s, "async": math.inf}[mode])
    worst = max(st.staleness for st in steps)
    if mode != "sync" and worst > bound:
        return CaseResult(label, False, [f"a gradient was {worst} updates stale, more than SSP allows "
                                         f"((W - 1)(2s + 1) = {bound}): fast workers ran too far ahead"])
    return CaseResult(label, not seen, [f"the rule {seen[0]}"] if seen else [])


def check_may_start(fn: Callable[[int, Sequence[int], float], bool],
                    rules: Sequence[tuple[int, tuple[int, ...], float, str]] = CASES) -> CheckResult:
    """Test `fn(clock, clocks, staleness)` against SSP's rule and explain each difference. `rules`:
    (clock, clocks, staleness, what a wrong answer means), default `CASES` (the grader adds its own)."""
    if not callable(fn):
        raise ValueError(f"fn={fn!r} is not a function: pass your function itself, e.g. "
                         "check_may_start(my_may_start), without calling it")
    cases = [_rule_case(fn, clock, clocks, s, meaning) for clock, clocks, s, meaning in rules]
    cases += [_simulated_case(fn, mode, times, s) for mode, times, s in _scenarios()]
    return CheckResult("check_may_start", cases, case_heading="case")
