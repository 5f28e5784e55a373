"""Planted hangs: a small training-like program of collectives, and one rank that gets it wrong.

`program(steps)` is what every rank should issue: per step, the all-reduce of two gradient buckets of
different sizes, then the broadcast of a flag from rank 0 (so that consecutive collectives always differ,
and a skipped or moved one shows at the number where it happened). A `Planting` makes one rank skip
collective (step, index), swap it with the next one, or send one more element. `run_planted` runs the
program on a group with a short timeout, so the ranks that wait for the culprit give up within seconds
(a gloo "Timed out waiting ... for recv" error), and hands back each rank's flight record for `hang`.
"""

from __future__ import annotations

import datetime
import random
from dataclasses import dataclass

import torch
import torch.distributed as dist

from distlab.observe import flight

STEP = (("all_reduce", 6), ("all_reduce", 4), ("broadcast", 2))  # one step's collectives and sizes
MISTAKES = ("skip", "order", "size")


@dataclass(frozen=True)
class Planting:
    """Rank `rank` gets collective `index` of step `step` wrong, by `mistake` (one of MISTAKES)."""

    rank: int
    step: int
    index: int
    mistake: str

    def seq(self) -> int:
        """The sequence number (from 1, in a fresh group) of the collective the planting breaks."""
        return self.step * len(STEP) + self.index + 1


def program(steps: int) -> list[tuple[str, int]]:
    """The collectives every rank should issue, in order."""
    return [c for _ in range(steps) for c in STEP]


def planted_calls(steps: int, planting: Planting | None, rank: int) -> list[tuple[str, int]]:
    """The collectives `rank` issues under `planting` (None: the correct program)."""
    calls = program(steps)
    if planting is None or planting.rank != rank:
        return calls
    i = planting.seq() - 1
    if not 0 <= i < len(calls) or planting.mistake not in MISTAKES:
        raise ValueError(f"{planting} is outside the program of {steps} steps x {len(STEP)} collectives or "
                         f"its mistake is not one of {MISTAKES}")
    if planting.mistake == "skip":
        return calls[:i] + calls[i + 1:]
    if planting.mistake == "order":
        if i + 1 >= len(calls):
            raise ValueError(f"{planting} swaps the last collective with nothing; pick an earlier one")
        return calls[:i] + [calls[i + 1], calls[i]] + calls[i + 2:]
    op, n = calls[i]
    return calls[:i] + [(op, n + 1)] + calls[i + 1:]


def random_planting(rng: random.Random, world_size: int, steps: int) -> Planting:
    """A planting drawn from `rng`: which rank, which step, which collective, which mistake."""
    mistake = rng.choice(MISTAKES)
    last = steps * len(STEP) - (2 if mistake == "order" else 1)
    seq0 = rng.randint(0, last)
    return Planting(rng.randrange(world_size), seq0 // len(STEP), seq0 % len(STEP), mistake)


def issue(calls: list[tuple[str, int]], group: dist.ProcessGroup, dev: torch.device) -> None:
    """Issue `calls` on `group`, in order (a broadcast from the group's first rank)."""
    root = dist.get_global_rank(group, 0)
    for op, n in calls:
        t = torch.ones(n, device=dev)
        if op == "all_reduce":
            dist.all_reduce(t, group=group)
        else:
            dist.broadcast(t, root, group=group)


def run_planted(steps: int, planting: Planting | None, timeout: float = 1.0) -> tuple[str, list]:
    """On a rank: run the program with `planting` on a new gloo group of the whole world whose collectives
    time out after `timeout` seconds; return ("ok" or the error's first line, this rank's flight record).

    The group is gloo with CPU tensors on every node: a rank left waiting then raises after `timeout`
    and can still read its record. (On NCCL a timed-out collective makes the watchdog end the process;
    there the flight recorder writes its dump to files instead, `TORCH_FR_DUMP_TEMP_FILE`.)
    Needs `flight.BUFFER_VAR` set before the launch (see `flight.enabled`)."""
    group = dist.new_group(timeout=datetime.timedelta(seconds=timeout), backend="gloo")
    outcome = "ok"
    try:
        issue(planted_calls(steps, planting, dist.get_rank()), group, torch.device("cpu"))
    except RuntimeError as e:  # the timeout of a rank left waiting (or a peer's closed connection)
        outcome = str(e).splitlines()[0][:200]
    return outcome, flight.dump(group)
