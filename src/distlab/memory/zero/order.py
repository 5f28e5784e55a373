"""Stage 3's one rule of order: every rank gathers the same unit next, or every rank raises.

In ZeRO stage 3 (Rajbhandari et al. 2020, sec. 5.3) and FSDP (Zhao et al. 2023) a unit's parameters
exist whole only while it runs: every rank all-gathers the unit before its forward and again before its
backward. A collective pairs the k-th call of each rank, so the ranks must run the same units in the
same order. If one rank skips a block (a layer dropped at random with a per-rank seed, an early exit
taken by some ranks), its all-gathers no longer pair with the others': the ranks wait for each other in
different collectives (a hang that the launcher reports as a deadlock, not its cause), or two units of
the same size are gathered into each other.

So before each unit's forward, and where each backward begins (a rank that skipped the last blocks has no
forward left to disagree on), each rank sends one integer, the unit and the phase it is about to run, to all
the others: an all-reduce of p integers, each rank's in its own place (an all-gather written as a sum, like
`uneven`'s flags, so that a count of the gathers' bytes never includes it). Equal everywhere: go on.
Different: every rank sees the same table and raises the same RuntimeError at once, naming the unit each
rank was about to run. It is a control message (labelled `uneven.CONTROL`, outside the paper's 3 Psi), one
per unit per forward and one per backward: latency, not bandwidth. (The rest of a backward follows from the
forward; a unit whose output one rank leaves out of its loss is `uneven`'s case.)
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

from distlab.comm_log import where
from distlab.memory.zero.uneven import CONTROL

PHASES = ("forward", "backward")


def _ranks(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def agree_on_unit(unit: int, phase: str, names: Sequence[str], group: dist.ProcessGroup | None,
                  device: torch.device | None = None, who: str = "ZeRO stage 3") -> None:
    """Share (`unit`, `phase`) over `group` (an all-reduce, labelled CONTROL); raise a RuntimeError on
    every rank, naming what each rank was about to run (`names[unit]`) and the fix, where they differ."""
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    every = torch.zeros(n, dtype=torch.int64, device=device)
    every[rank] = 2 * unit + PHASES.index(phase)
    with where(CONTROL):
        dist.all_reduce(every, group=group)
    if every.is_meta:  # a dry run: no values come back
        return
    codes = every.tolist()
    if len(set(codes)) == 1:
        return
    runs: dict[int, list[int]] = {}
    for r, code in enumerate(codes):
        runs.setdefault(code, []).append(r)

    def unit_of(code: int) -> str:
        i = code // 2
        return f"the {PHASES[code % 2]} of {names[i] if i < len(names) else f'unit {i}'}"

    table = "; ".join(f"{_ranks(ranks)} {unit_of(code)}" for code, ranks in runs.items())
    raise RuntimeError(
        f"{who}: the ranks of the group of {n} disagree on the module they run next: {table}. Every rank "
        "all-gathers a unit's parameters before it runs, so under ZeRO-3 / FSDP every rank must run the "
        "same modules in the same order; a module skipped on some ranks (a dropped layer, an early exit) "
        "pairs its all-gathers with other modules' (a hang, or parameters gathered into the wrong module). "
        "Run every module on every rank (multiply a dropped block's output by zero, or draw the skip from "
        "a seed that every rank shares)")
