"""Which rank orthogonalises which matrix: owners balanced by Newton-Schulz work.

Muon's Newton-Schulz needs a whole matrix on one rank, so each matrix gets an owner. Its cost is
`newton_schulz_flops` (about 4 m^2 n + 2 m^3 per iteration for an m x n matrix, m <= n), very uneven
between, say, a square attention projection and a wide MLP weight. Assigning owners is scheduling
independent jobs on identical machines to minimise the largest load (makespan); the greedy rule takes the
jobs from the largest down and gives each to the least-loaded rank so far: Graham's LPT rule, within 4/3
of the best makespan (Graham 1969, "Bounds on multiprocessing timing anomalies"). Ties go to the lowest
rank, so every rank computes the same owners without talking.

AdamW's tensors (element-wise, `split.py`) are given owners the same way, by their number of elements,
for the gather-to-owner layout (`owner.py`), which holds every tensor whole.
"""

from __future__ import annotations

from collections.abc import Sequence


def greedy_owners(costs: Sequence[float], world: int) -> list[int]:
    """owners[i]: the rank of `world` that takes job i, by LPT (largest cost first, least-loaded rank)."""
    if isinstance(world, bool) or not isinstance(world, int) or world < 1:
        raise ValueError(f"world={world!r} must be a positive number of ranks")
    owners = [0] * len(costs)
    loads = [0.0] * world
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        rank = min(range(world), key=lambda r: (loads[r], r))
        owners[i] = rank
        loads[rank] += costs[i]
    return owners


def loads(costs: Sequence[float], owners: Sequence[int], world: int) -> list[float]:
    """The total cost on each rank for these owners."""
    if len(costs) != len(owners):
        raise ValueError(f"{len(costs)} costs but {len(owners)} owners; give one owner per job")
    total = [0.0] * world
    for cost, rank in zip(costs, owners, strict=True):
        if not 0 <= rank < world:
            raise ValueError(f"owner {rank} is not a rank of {world}; owners are 0 .. {world - 1}")
        total[rank] += cost
    return total


def imbalance(costs: Sequence[float], owners: Sequence[int], world: int) -> float:
    """The largest rank's load over the mean load (1.0 is perfect balance; the step waits for the largest)."""
    per_rank = loads(costs, owners, world)
    mean = sum(per_rank) / world
    return max(per_rank) / mean if mean else 1.0
