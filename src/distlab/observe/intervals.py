"""Exact arithmetic on sets of time intervals: the union, intersection and difference that overlap needs.

A trace is a list of (start, end) intervals per thread. "How much communication was hidden behind
computation" is the length of the intersection of two unions of intervals; "how much was exposed" is the
length of a difference (the same arithmetic Holistic Trace Analysis uses for its comm/comp overlap,
Meta's HTA documentation, "Communication computation overlap"). Intervals are half-open [a, b) with
a <= b; empty ones are dropped. Pure Python, exact on the numbers given (no tolerance).
"""

from __future__ import annotations

from collections.abc import Iterable

Interval = tuple[float, float]


def check_interval(a: float, b: float) -> None:
    """Raise a ValueError naming an interval whose end comes before its start."""
    if b < a:
        raise ValueError(f"interval ({a}, {b}) ends before it starts; pass (start, end) with start <= end")


def union(intervals: Iterable[Interval]) -> list[Interval]:
    """The union as disjoint intervals in time order (touching intervals merge)."""
    merged: list[Interval] = []
    for a, b in sorted(intervals):
        check_interval(a, b)
        if a == b:
            continue
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged


def length(intervals: Iterable[Interval]) -> float:
    """Total time covered by the intervals (overlaps counted once)."""
    return sum(b - a for a, b in union(intervals))


def intersection(first: Iterable[Interval], second: Iterable[Interval]) -> list[Interval]:
    """The time covered by both sets, as disjoint intervals in time order."""
    x, y = union(first), union(second)
    out: list[Interval] = []
    i = j = 0
    while i < len(x) and j < len(y):
        a, b = max(x[i][0], y[j][0]), min(x[i][1], y[j][1])
        if a < b:
            out.append((a, b))
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return out


def difference(first: Iterable[Interval], second: Iterable[Interval]) -> list[Interval]:
    """The time covered by `first` and not by `second`, as disjoint intervals in time order."""
    out: list[Interval] = []
    cut = union(second)
    for a, b in union(first):
        start = a
        for c, d in cut:
            if d <= start or c >= b:
                continue
            if c > start:
                out.append((start, c))
            start = max(start, d)
        if start < b:
            out.append((start, b))
    return out


def clip(intervals: Iterable[Interval], window: Interval) -> list[Interval]:
    """The parts of the intervals inside `window`."""
    return intersection(intervals, [window])
