"""Checks of the lab's two exercises; each returns a `distlab.checks.CheckResult` that says what is wrong.

1. `check_loss_scale_update(fn)`: the dynamic loss-scale rule, `fn(scale, growth_tracker, found_inf,
   growth_factor, backoff_factor, growth_interval) -> (scale, growth_tracker)`, run over scripted
   sequences of clean and overflowing steps against `precision.update_scale` (GradScaler's rule).
2. `check_sqrt_segments(fn)`: `fn(n_layers) -> list of segment lengths` for Chen et al. 2016's
   checkpointing, whose cost (kept segment inputs + the longest segment, in layers) must be the least
   possible for each n.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from distlab.checks import CaseResult, CheckResult, is_stub, not_written
from distlab.memory.estimate.cost_model import segment_peak_units
from distlab.memory.techniques.precision import update_scale

# label, (scale, tracker) at the start, found_inf per step, growth_interval, growth_factor, backoff_factor
SCALE_CASES = (
    ("an overflow halves the scale", (1024.0, 5), (True,), 10, 2.0, 0.5),
    ("growth after growth_interval clean steps", (1024.0, 0), (False, False, False, False), 3, 2.0, 0.5),
    ("an overflow restarts the count", (1024.0, 0), (False, False, True, False, False, False), 3, 2.0, 0.5),
    ("other factors", (256.0, 0), (False, False, True, False, False), 2, 4.0, 0.25),
)


def _scale_diagnosis(
    start: tuple[float, int],
    found_inf: bool,
    got: tuple[float, int],
    want: tuple[float, int],
    interval: int,
    growth: float,
    backoff: float,
) -> list[str]:
    (scale, tracker), (g_scale, g_tracker) = start, got
    state = f"from scale={scale:g}, growth_tracker={tracker}, found_inf={found_inf}"
    lines = [f"{state}: you returned ({g_scale:g}, {g_tracker}), expected ({want[0]:g}, {want[1]})"]
    if found_inf:
        lines += _overflow_hint(scale, g_scale, want[0], backoff)
    else:
        lines += _clean_step_hint(scale, g_scale, want[0], interval, growth)
    if g_scale == want[0] and g_tracker != want[1]:
        lines.append(
            "after an overflow or a growth the count of clean steps restarts at 0"
            if want[1] == 0
            else "a clean step adds one to growth_tracker"
        )
    return lines


def _overflow_hint(scale: float, g_scale: float, want_scale: float, backoff: float) -> list[str]:
    """Why the scale returned after an overflowing step is wrong ([] when it is right)."""
    if g_scale > scale:
        return ["you grew the scale after a skipped step; an overflow must shrink it (times backoff_factor)"]
    if g_scale == scale:
        return ["the scale did not change after an overflow; multiply it by backoff_factor"]
    if g_scale != want_scale:
        return [f"after an overflow the scale must be multiplied by backoff_factor={backoff:g}"]
    return []


def _clean_step_hint(scale: float, g_scale: float, want_scale: float, interval: int,
                     growth: float) -> list[str]:
    """Why the scale returned after a clean step is wrong ([] when it is right)."""
    if g_scale < scale:
        return ["you shrank the scale after a clean step; only an overflow shrinks it"]
    if g_scale > scale and want_scale == scale:
        return [f"you grew the scale too early: it grows only once growth_interval={interval} clean steps "
                "in a row have passed"]
    if g_scale == scale and want_scale > scale:
        return [f"after growth_interval={interval} clean steps in a row the scale must grow by "
                f"growth_factor={growth:g}; yours did not"]
    if g_scale != want_scale:
        return [f"the scale must grow by growth_factor={growth:g}, not by {g_scale / scale:g}"]
    return []


def _scale_case(fn: Callable[..., tuple[float, int]], case: tuple) -> CaseResult:
    label, start, flags, interval, growth, backoff = case
    state = start
    for step, found_inf in enumerate(flags):
        want = update_scale(*state, found_inf, growth, backoff, interval)
        try:
            got = fn(state[0], state[1], found_inf, growth, backoff, interval)
            got = (float(got[0]), int(got[1]))
        except Exception as e:  # reported, not raised; the stub says "not written yet"
            if is_stub(e):
                return not_written(label)
            return CaseResult(label, False, [f"step {step}: your function raised {type(e).__name__}: {e}"])
        if got != want:
            lines = _scale_diagnosis(state, found_inf, got, want, interval, growth, backoff)
            return CaseResult(label, False, [f"step {step}: " + lines[0], *lines[1:]])
        state = want
    return CaseResult(label, True)


def check_loss_scale_update(fn: Callable[..., tuple[float, int]], scripts: Sequence[tuple] = SCALE_CASES
                            ) -> CheckResult:
    """Run `fn` through the scripted cases (`scripts`, as in `SCALE_CASES`) beside GradScaler's rule; name
    the first wrong step and why."""
    return CheckResult(
        "dynamic loss-scale update", [_scale_case(fn, c) for c in scripts], case_heading="case"
    )


def best_segment_cost(n: int) -> int:
    """The least kept-inputs + longest-segment cost over all segmentations of n layers:
    min over k of ceil(n/k) + k."""
    return min(math.ceil(n / k) + k for k in range(1, n + 1))


def _segment_case(fn: Callable[[int], Sequence[int]], n: int) -> CaseResult:
    label = f"n = {n}"
    try:
        segments = list(fn(n))
    except Exception as e:  # reported, not raised; the stub says "not written yet"
        if is_stub(e):
            return not_written(label)
        return CaseResult(label, False, [f"your function raised {type(e).__name__}: {e}"])
    problem = _segments_problem(segments, n)
    if problem:
        return CaseResult(label, False, [problem])
    cost, best = segment_peak_units(segments), best_segment_cost(n)
    if cost <= best:
        return CaseResult(label, True)
    lines = [
        f"{len(segments)} segments, longest {max(segments)}: cost {len(segments)} kept inputs + "
        f"{max(segments)} recomputed = {cost} layers of activations; the best is {best}",
        _segment_hint(segments, n),
    ]
    return CaseResult(label, False, lines)


def _segments_problem(segments: list, n: int) -> str:
    """Why `segments` is not a segmentation of n layers ("" when it is one)."""
    if not segments or any(not isinstance(k, int) or k < 1 for k in segments):
        return f"you returned {segments}; return a list of positive whole numbers of layers, one per segment"
    if sum(segments) != n:
        return (
            f"your segments {segments} add up to {sum(segments)} layers; they must "
            f"cover all {n} layers exactly once"
        )
    return ""


def _segment_hint(segments: list[int], n: int) -> str:
    """What to change in a segmentation of n layers that costs more than the best."""
    if len(segments) == 1 and n > 2:
        return "one segment keeps a single input but recomputes the whole model at once"
    if max(segments) == 1 and n > 2:
        return "segments of one layer are per-layer checkpointing: every layer's input is kept"
    return (f"aim for about sqrt({n}) = {math.sqrt(n):.1f} segments of about sqrt(n) layers, "
            "as even as possible")


def check_sqrt_segments(
    fn: Callable[[int], Sequence[int]], sizes: Sequence[int] = (1, 2, 4, 9, 10, 16, 24, 50, 100)
) -> CheckResult:
    """Check `fn(n)` for each n in `sizes`: segments that cover the n layers at the least cost."""
    return CheckResult(
        "sqrt(n) checkpoint segments", [_segment_case(fn, n) for n in sizes], case_heading="layers"
    )
