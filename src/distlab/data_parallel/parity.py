"""Parity: data-parallel training must end with the weights of one process training on the whole batch.

The data-parallel gradient is the same sum as the single-process one, of the same float32 terms, added in
another order (per rank first, then across ranks by the all-reduce). float32 rounds each addition to a
relative 2**-24 (about 6e-8), so after a few SGD steps the parameters (of size 0.1 to 1) agree to about
1e-7; `TOLERANCE` allows a hundred times that, and is still far below what a real bug does (a missing
division by p, a rank's shard dropped, a bucket left out: 1e-3 or more).

- `max_difference`: the largest absolute difference between two sets of parameters, and where it is;
- `compare`: that difference as a verdict against the tolerance, or an AssertionError that names it;
- `train_on_mesh_dim`: inside the ranks, build a `distlab.mesh.grid` and train with data parallelism over
  one of its dims, so that a test or the lab can check that every group of that dim is a whole DP job.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist
from torch import Tensor

from distlab import mesh
from distlab.data_parallel.train import Task, train_data_parallel

TOLERANCE = 1e-5  # absolute, on float32 parameters of size ~0.1-1 after a few steps (see the docstring)


def max_difference(a: dict[str, Tensor], b: dict[str, Tensor]) -> tuple[float, str]:
    """The largest absolute difference between two sets of parameters, and the parameter where it is."""
    if a.keys() != b.keys():
        raise ValueError(f"the two models have different parameters: {sorted(a.keys() ^ b.keys())}; "
                         "compare a model with its own reference")
    diffs = {name: (a[name] - b[name]).abs().max().item() for name in a}
    worst = max(diffs, key=lambda n: diffs[n])
    return diffs[worst], worst


def compare(params: dict[str, Tensor], reference: dict[str, Tensor], label: str,
            tolerance: float = TOLERANCE) -> str:
    """One line saying that `params` equal `reference` within `tolerance` (the same on every machine),
    or an AssertionError that names the parameter that differs most and by how much."""
    diff, where = max_difference(params, reference)
    if not diff <= tolerance:  # also catches NaN
        raise AssertionError(f"{label}: parameter {where!r} differs from the single-process reference by "
                             f"{diff:.3g}, more than the tolerance {tolerance:g}")
    return f"{label}: all {len(params)} parameters equal one process's within {tolerance:g}: ok"


def train_on_mesh_dim(task: Task, dims: dict[str, int], dim: str = "dp", seeds: dict[int, int] | None = None,
                      **train: Any) -> dict[str, Any]:
    """Inside each rank: build `mesh.grid(**dims)` and train `task` with data parallelism over the group
    of dim `dim` (`train_data_parallel(..., group=mesh[dim].get_group())`).

    Every group of that dim is an independent DP job. `seeds` maps a rank's coordinate along the *other*
    dims (its index among the groups, 0, 1, ...) to the seed of its job, so that the jobs can train on
    different data and weights at once; by default all use `train.get("seed", 0)`. Returns this rank's
    coordinates, its job's index and seed, the global ranks of its group and the final parameters.
    """
    if dim not in dims:
        raise ValueError(f"dim={dim!r} is not one of the grid's dims {sorted(dims)}; train over one of them")
    grid = mesh.grid(**dims)
    group = grid[dim].get_group()
    coords = mesh.coordinates(dist.get_rank(), **dims)
    others = [name for name in mesh.AXIS_ORDER if name in dims and name != dim]
    job = 0
    for name in others:  # the index of this rank's group among the groups of `dim`, row-major
        job = job * dims[name] + coords[name]
    default_seed = train.pop("seed", 0)
    seed = (seeds or {}).get(job, default_seed)
    params = train_data_parallel(task, group=group, seed=seed, **train)
    return {"coordinates": coords, "job": job, "seed": seed, "group": dist.get_process_group_ranks(group),
            "params": params}
