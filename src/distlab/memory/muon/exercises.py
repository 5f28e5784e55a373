"""The check of the lab's Muon exercise: assign each matrix an owner so that no rank waits long.

`check_owners(fn)` calls `fn(shapes, world) -> owners` (one rank in 0 .. world - 1 per matrix) on a few
models and compares the largest rank's Newton-Schulz FLOPs (`newton_schulz.newton_schulz_flops`) with
the greedy largest-first rule's (`owners.greedy_owners`, Graham's LPT). Owners as good as that pass; a
worse assignment is explained: owners dealt in turn (round robin), owners balanced by elements rather
than FLOPs (Newton-Schulz costs about m^2 n, not m n), everything on one rank, a rank out of range.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from distlab.checks import CaseResult, CheckResult, is_stub, not_written
from distlab.memory.muon.newton_schulz import newton_schulz_flops
from distlab.memory.muon.owners import greedy_owners, loads

Shapes = Sequence[tuple[int, int]]

# label, matrix shapes, world: a GPT block's four matrices, uneven shapes, more ranks than matrices
OWNER_CASES: tuple[tuple[str, tuple[tuple[int, int], ...], int], ...] = (
    ("2 GPT blocks, width 64, on 3 ranks", ((192, 64), (64, 64), (256, 64), (64, 256)) * 2, 3),
    ("five shapes on 2 ranks", ((13, 7), (11, 13), (9, 11), (6, 9), (5, 6)), 2),
    ("one big, many small, on 4 ranks", ((512, 512),) + ((32, 128),) * 9, 4),
    ("3 matrices on 4 ranks", ((96, 32), (32, 32), (128, 32)), 4),
)


def _diagnose(shapes: Shapes, world: int, owners: list[int], worst: float, best: float) -> list[str]:
    lines = [f"your largest rank does {worst:.3g} FLOPs of Newton-Schulz; the greedy rule's does {best:.3g}"]
    if owners == [i % world for i in range(len(shapes))]:
        lines.append("you dealt the matrices out in turn (round robin), which ignores how big each one is")
    elif owners == greedy_owners([a * b for a, b in shapes], world):
        lines.append("you balanced the matrices' elements; Newton-Schulz costs about 4 m^2 n + 2 m^3 for an "
                     "m x n matrix (m <= n), so balance newton_schulz_flops(shape) instead")
    elif len(set(owners)) == 1 and world > 1:
        lines.append("every matrix is on one rank: the others wait for it")
    else:
        lines.append("give the largest jobs out first, each to the rank with the least work so far")
    return lines


def _owner_case(fn: Callable[[Shapes, int], Sequence[int]], case: tuple) -> CaseResult:
    label, shapes, world = case
    try:
        owners = [int(o) for o in fn(list(shapes), world)]
    except Exception as e:  # reported, not raised; the stub says "not written yet"
        if is_stub(e):
            return not_written(label)
        return CaseResult(label, False, [f"your function raised {type(e).__name__}: {e}"])
    if len(owners) != len(shapes):
        return CaseResult(label, False, [f"you returned {len(owners)} owners for {len(shapes)} matrices; "
                                         "return one rank per matrix"])
    if any(not 0 <= o < world for o in owners):
        return CaseResult(label, False, [f"owners {owners} name a rank outside 0 .. {world - 1}"])
    costs = [newton_schulz_flops(s) for s in shapes]
    worst = max(loads(costs, owners, world))
    best = max(loads(costs, greedy_owners(costs, world), world))
    if worst <= best:
        return CaseResult(label, True)
    return CaseResult(label, False, _diagnose(shapes, world, owners, worst, best))


def check_owners(fn: Callable[[Shapes, int], Sequence[int]]) -> CheckResult:
    """Run `fn(shapes, world)` on each case; pass when its largest load is at most the greedy rule's."""
    return CheckResult("Newton-Schulz owners", [_owner_case(fn, c) for c in OWNER_CASES], case_heading="case")
