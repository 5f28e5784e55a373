"""The check of lab 13's exercise: find the planted hang.

The student writes `fn(records)`: given each rank's flight record ({rank: [CollectiveRecord, ...]}),
return `(seq, rank)`, the sequence number where the ranks first disagree and the rank that broke it (the
one whose call differs from the majority's). The check draws plantings with a seed (which rank, which
step, which collective; skipped, reordered or resized), builds the records a hang leaves (every rank stops
at or a little after the broken collective, as a real gloo hang leaves them), and compares the answer with
the planting, on 4 and 5 ranks.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence

from distlab.checks import CaseResult, CheckResult, not_written
from distlab.observe.flight import CollectiveRecord
from distlab.observe.plant import Planting, planted_calls, random_planting

Finder = Callable[[Mapping[int, Sequence[CollectiveRecord]]], tuple[int, int]]


def hang_records(steps: int, world: int, planting: Planting, rng: random.Random,
                 extra: int = 2) -> dict[int, list]:
    """The records each rank holds after `planting` hung the program: its calls up to the broken collective,
    and up to `extra` more on some ranks (a resized all-reduce can complete on some ranks before it fails)."""
    s = planting.seq()
    out = {}
    for r in range(world):
        calls = planted_calls(steps, planting, r)[:s + rng.randint(0, extra)]
        out[r] = [CollectiveRecord(i + 1, f"gloo:{op}", ((n,),)) for i, (op, n) in enumerate(calls)]
    return out


def _case(fn: Finder, world: int, seed: int, trials: int) -> CaseResult:
    label = f"{world} ranks, {trials} plantings (seed {seed})"
    rng = random.Random(seed)
    misses = []
    for _ in range(trials):
        planting = random_planting(rng, world, steps=4)
        try:
            got = fn(hang_records(4, world, planting, rng))
        except NotImplementedError:  # the student version's stub
            return not_written(label)
        if tuple(got) != (planting.seq(), planting.rank):
            misses.append(f"{planting.mistake} by rank {planting.rank} at collective #{planting.seq()}: "
                          f"returned {tuple(got)}")
    if not misses:
        return CaseResult(label, True, [f"named the rank and the sequence number in all {trials}"])
    hint = ("align the ranks' records by sequence number; at the first number where they differ, the "
            "majority's (operation, sizes) is what should have run, and the odd rank is the culprit; a rank "
            "with no record there counts as different")
    return CaseResult(label, False, [f"{len(misses)} of {trials} wrong, e.g. {misses[0]}", hint])


def check_find_hang(fn: Finder, trials: int = 50, seed: int = 0,
                    worlds: Sequence[int] = (4, 5)) -> CheckResult:
    """`fn(records)` must return (sequence number, rank) of every planted mistake, on each number of ranks
    in `worlds` (the lab's cases: 4 and 5; 3 or more, so that a majority can name the odd rank)."""
    if any(isinstance(w, bool) or not isinstance(w, int) or w < 3 for w in worlds):
        raise ValueError(f"worlds={tuple(worlds)!r} must be numbers of ranks of at least 3 (with 2 ranks no "
                         "majority says which one broke the order), e.g. worlds=(4, 5)")
    cases = [_case(fn, world, seed + world, trials) for world in worlds]
    return CheckResult("find the planted hang", cases, case_heading="case")
