"""Parity: data-parallel training must end with the weights of one process training on the whole batch.

The data-parallel gradient is the same sum as the single-process one, of the same float32 terms, added in
another order (per rank first, then across ranks by the all-reduce). float32 rounds each addition to a
relative 2**-24 (about 6e-8), so after a few SGD steps the parameters (of size 0.1 to 1) agree to about
1e-7; float32's tolerance in `distlab.parity.TOLERANCE`, 1e-5, allows a hundred times that, and is still
far below what a real bug does (a missing division by p, a rank's shard dropped, a bucket left out: 1e-3
or more).

- `parameters_parity`: a run's final parameters against `train.train_single_process`'s, as a
  `distlab.parity.ParityReport` (print its `verdict()`; `assert_passed()` names the worst parameter);
- `train_on_mesh_dim`: inside the ranks, build a `distlab.mesh.grid` and train with data parallelism over
  one of its dims, so that a test or the lab can check that every group of that dim is a whole DP job.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist
from torch import Tensor

from distlab import mesh
from distlab.data_parallel.train import train_data_parallel
from distlab.parity import ParityReport, compare
from distlab.reference import Task


def parameters_parity(params: dict[str, Tensor], reference: dict[str, Tensor], label: str) -> ParityReport:
    """The final parameters of a data-parallel run against one process's, within float32's tolerance:
    `verdict()` reads "<label>: all 6 parameters agree with one process within 1e-05: ok"."""
    return compare(params, reference, name="parameters", label=label, against="one process")


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
    others = [name for name in mesh.DIM_ORDER if name in dims and name != dim]
    job = 0
    for name in others:  # the index of this rank's group among the groups of `dim`, row-major
        job = job * dims[name] + coords[name]
    default_seed = train.pop("seed", 0)
    seed = (seeds or {}).get(job, default_seed)
    params = train_data_parallel(task, group=group, seed=seed, **train)
    return {"coordinates": coords, "job": job, "seed": seed, "group": dist.get_process_group_ranks(group),
            "params": params}
