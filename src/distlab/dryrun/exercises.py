"""The check of lab 12's exercise: predict the bytes a rank sends on the tp axis, then dry-run it.

The student writes `fn(layout, rank)`, the bytes rank `rank` of `layout` sends on the tp axis in one step
(all-reduces of tensor parallelism, Shoeybi et al. 2019, sec. 3: four per block and micro-batch in the
forward and backward passes, each of b s h elements, plus the embedding's on the first stage), each
all-reduce sending 2 (t - 1)/t of its buffer on a ring (Patarasuk & Yuan 2009). The check dry-runs the
same rank (`dry_run`) for the given layout and for the same layout with half the micro-batches, so that
a number copied from one run does not pass, and compares within 1 %.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from distlab.checks import CaseResult, CheckResult, not_written
from distlab.dryrun.layouts import DryLayout
from distlab.dryrun.run import dry_run

TOLERANCE = 0.01


def _cases(layout: DryLayout) -> list[DryLayout]:
    """The layout, and the same with half as many micro-batches (when it has more than one)."""
    p = layout.plan
    if p.m < 2:
        return [layout]
    m = p.m // 2
    half = dataclasses.replace(layout, plan=dataclasses.replace(p, m=m), batch=layout.batch // p.m * m)
    return [layout, half]


def _case(fn: Callable[[DryLayout, int], float], layout: DryLayout, rank: int) -> CaseResult:
    label = f"rank {rank}, {layout.config.n_layer} blocks, m={layout.plan.m} micro-batches"
    try:
        got = fn(layout, rank)
    except NotImplementedError:  # the student version's stub
        return not_written(label)
    want = dry_run(layout, rank).traffic[("tp", "all_reduce")].sent_bytes
    if isinstance(got, bool) or not isinstance(got, int | float):
        return CaseResult(label, False, [f"returned {got!r}; return the bytes as a number"])
    if abs(got - want) <= TOLERANCE * want:
        return CaseResult(label, True, [f"{got / 1e9:.2f} GB, the dry run sent {want / 1e9:.2f} GB"])
    hint = ("per micro-batch and block, 4 all-reduces of b s h elements (e bytes each), each sending "
            "2 (t - 1)/t of its buffer; the first stage adds the embedding's, one per micro-batch")
    return CaseResult(label, False, [f"returned {got / 1e9:.3f} GB; the dry run sent {want / 1e9:.3f} GB "
                                     f"({got / want:.2f}x): {hint}"])


def check_tp_bytes(fn: Callable[[DryLayout, int], float], layout: DryLayout, rank: int) -> CheckResult:
    """`fn(layout, rank)` must return the bytes rank `rank` sends on the tp axis in one step of `layout`,
    within 1 % of what a dry run of that rank records, for `layout` and for it with half the micro-batches."""
    cases = [_case(fn, lay, rank) for lay in _cases(layout)]
    return CheckResult("the bytes a rank sends on the tp axis", cases, case_heading="layout")
