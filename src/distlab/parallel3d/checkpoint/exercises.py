"""The checkpoint lab's exercise: how many steps does a failure cost, and how often to checkpoint?"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from distlab.checks import CaseResult, CheckResult, not_written
from distlab.parallel3d.checkpoint.cost_model import steps_lost

# (kill_at, every): mid-interval, just after a checkpoint, at the start, every step, before the first one
LOST_CASES = ((5, 3), (6, 3), (0, 4), (9, 1), (7, 10), (100, 7))


def check_steps_lost(fn: Callable[[int, int], int], settings: Sequence[tuple[int, int]] = LOST_CASES
                     ) -> CheckResult:
    """`fn(kill_at, every)` must return the steps redone after a failure just before step `kill_at`
    (0-based) with a checkpoint after every `every` steps (the same as `cost_model.steps_lost`)."""
    cases = []
    for kill_at, every in settings:
        want = steps_lost(kill_at, every)
        try:
            got = fn(kill_at, every)
        except NotImplementedError:  # the student version's stub
            cases.append(not_written(f"kill_at={kill_at}, every={every}"))
            continue
        lines = [] if got == want else [f"fn({kill_at}, {every}) returned {got!r}; the last checkpoint was "
                                        f"after step {kill_at // every * every}, so {want} steps are redone"]
        cases.append(CaseResult(f"kill_at={kill_at}, every={every}", got == want, lines))
    return CheckResult("steps lost to a failure", cases, case_heading="case")
